// flash_attention_mma.cu: the FlashAttention-2 kernels of flash_attention.cu, with every
// matrix product on the tensor cores (TF32 mma.sync, sm_80 and newer) instead of scalar fmaf.
//
// Same algorithm, arguments, masks, tiles walked and outputs as flash_attention.cu (read that
// file first: it explains the online softmax, the masks, the backward's two kernels and why
// they are deterministic); the backward's D = rowsum(dO * O) is its flash_attn_bwd_preprocess.
// What differs is who multiplies: here one warp instruction,
//
//   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32   D (16 x 8) = A (16 x 8) B (8 x 8) + C
//
// does 1024 multiply-adds from operands the 32 lanes hold in registers, a few per lane. The
// fmaf kernel is bound by shared memory (one 16-byte load feeds 4 to 16 FMAs); here one
// 4-byte load per lane feeds 16 multiply-adds, and an SM's tensor cores do several times the
// multiply-adds a cycle of its FMA units.
//
// Precision. TF32 keeps float32's exponent and 10 of its 23 significand bits: a product of two
// rounded inputs is off by about 1e-3 relative. PASSES = 3 ("3xTF32") splits every input into
// big + small, both TF32 (big = tf32(x), small = tf32(x - big): together 21 bits), and adds
// big*big + big*small + small*big, dropping only small*small: about float32's accuracy for
// three times the tensor-core work, which is what PyTorch's float32 SDPA kernel does on these
// GPUs (CUTLASS's "fast float32"). PASSES = 1 is plain TF32, as `set_float32_matmul_precision
// ("high")` allows for matmuls. Sums are float32 either way.
//
// Who owns what. A block is 4 warps; each warp owns 16 rows of the block's 64 (the mma's M)
// and every column of its products, so the warps never share a row and the softmax of a row
// stays inside one warp. In the mma's accumulator layout a lane (g = lane / 4, t = lane % 4)
// holds rows g and g + 8 and columns 2t, 2t + 1 of every 8-column slice:
//
//     S = Q K^T for a warp's 16 rows and a 64-key tile: 8 slices s[n] of 16 x 8
//         key ->   0 1 | 2 3 | 4 5 | 6 7 | 8 9 ...
//     row g      t=0   t=1   t=2   t=3   t=0 ...     (lanes 4g .. 4g + 3)
//     row g + 8  t=0   t=1   t=2   t=3   t=0 ...
//
// so a row's max and sum are the lane's own values, then two __shfl_xor_sync (1, 2) across
// the four lanes of the row.
//
// P V without a detour through shared memory. The next product, O += P V, wants P as its A
// operand, whose layout is another one: a lane holds A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4], while it holds P[g][2t], P[g][2t+1], P[g+8][2t], P[g+8][2t+1]. A sum over keys
// does not care in which order the keys come: let the mma's k = t stand for key 2t and
// k = t + 4 for key 2t + 1. Then the lane's own P values are exactly its A fragment
// (a = {p[0], p[2], p[1], p[3]}), and the B operand, V, is read in the same order:
// b = {V[2t][g], V[2t + 1][g]}. The backward's dQ += dS K, dV += P^T dO and dK += dS^T Q use the
// same trick (the dK/dV kernel computes S^T = K Q^T, so P^T comes out with keys as rows).
//
// Shared memory. K, V (and Q, dO) tiles are row-major with row stride LD = HSP + 4 floats.
// The loads of a B fragment, X[g][t] (lanes read 8 rows x 4 columns) and X[2t][g] (4 pairs
// of rows x 8 columns), then hit 32 different banks for every head size (LD % 32 is 4, 12,
// 20 or 28; the pairs of rows sit 2 LD apart, a multiple of 8 banks): no conflicts.
//
// Leaves out, for readability: ldmatrix (it moves 16-bit elements; TF32 fragments are read
// one float at a time), asynchronous copies and double buffering, the float2 loads an
// interleaved layout would allow, wgmma (sm_90's warpgroup instructions).
//
// Follows Dao, "FlashAttention-2" (2023), section 3.3 (work split between warps); the PTX ISA,
// "Matrix Fragments for mma.m16n8k8" (the layouts above); and Ootomo and Yokota, "Recovering
// single precision accuracy from Tensor Cores while surpassing the FP32 theoretical peak
// performance" (2022), for 3xTF32.

#ifndef HS
#define HS 64
#endif
#ifndef KT
#define KT 64  // rows of the tiles the loop walks: keys (forward, dQ) or queries (dK/dV)
#endif
#ifndef PASSES
#define PASSES 3  // 3: 3xTF32, about float32's accuracy; 1: TF32
#endif
#ifndef DROPOUT
#define DROPOUT 0  // 1: the module for attention dropout (as in flash_attention.cu)
#endif
#define WARPS 4
#define NTHREADS (32 * WARPS)
#define BM (16 * WARPS)           // rows a block owns: 16 per warp, the mma's M
#define HSP ((HS + 7) / 8 * 8)    // head dims padded with zeros to the mma's K = 8
#define LD (HSP + 4)              // row stride of every shared tile (see the header)
#define FULL_MASK 0xffffffffu
// Blocks per SM the dQ kernel asks registers for: 3 up to HS 64, where ptxas (sm_90) fits it in
// 168 registers (TF32: no spill; 3xTF32: 12 bytes, three floats kept in L1), where unasked it
// takes up to 243 and gets 2 blocks: 12 warps instead of 8 hide the latency of the loads that
// feed the mma. The other kernels need no cap: the forward takes at most 127 registers up to
// HS 64 (4 blocks) unasked, and dK/dV, with two accumulators, spills under a cap.
#define DQ_MIN_BLOCKS (HS > 64 ? 1 : 3)
static_assert(PASSES == 1 || PASSES == 3, "PASSES is 1 (TF32) or 3 (3xTF32)");
static_assert(KT % 8 == 0 && KT <= 64, "the walked tile is whole 8-column slices");
static_assert(HS >= 1 && HS <= 128, "head sizes 1..128");
#define NEG_INF (-__int_as_float(0x7f800000))

// ---- The two tensor-core instructions. On a GPU, inline PTX; in the emulator (which builds
// this file with the host compiler, where __CUDA_ARCH__ is not defined), its functions of the
// same meaning (minigrad/kernels/emulator/cuda_emulator.h).
__device__ __forceinline__ unsigned to_tf32(float x) {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
#else
    return ::emu::cvt_rna_tf32(x);
#endif
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    ::emu::mma_m16n8k8_tf32(d, a, b, __LINE__);
#endif
}

// N floats of a fragment as TF32 operands: big = tf32(x) and, for 3xTF32, small =
// tf32(x - big). Split once per fragment, not once per product: an A fragment feeds a whole
// row of products.
template <int N>
struct Tf32 {
    unsigned big[N];
#if PASSES == 3
    unsigned small[N];
#endif
};

template <int N>
__device__ __forceinline__ Tf32<N> split(const float (&x)[N]) {
    Tf32<N> out;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        out.big[i] = to_tf32(x[i]);
#if PASSES == 3
        out.small[i] = to_tf32(x[i] - __uint_as_float(out.big[i]));
#endif
    }
    return out;
}

// d += A B: one TF32 mma, or three (3xTF32): the two cross terms, then big * big (CUTLASS's
// order; another order differs only in float32's last bits).
__device__ __forceinline__ void mma(float (&d)[4], const Tf32<4>& a, const Tf32<2>& b) {
#if PASSES == 3
    mma_tf32(d, a.small, b.big);
    mma_tf32(d, a.big, b.small);
#endif
    mma_tf32(d, a.big, b.big);
}

// ---- Fragments from shared tiles (row-major, stride LD). g = lane / 4, t = lane % 4.

// A = X[r0 .. r0+15][c0 .. c0+7]: the A operand for a product with X's rows as its rows.
__device__ __forceinline__ void load_a(float (&a)[4], const float* X, int r0, int c0, int g,
                                       int t) {
    a[0] = X[(r0 + g) * LD + c0 + t];
    a[1] = X[(r0 + g + 8) * LD + c0 + t];
    a[2] = X[(r0 + g) * LD + c0 + t + 4];
    a[3] = X[(r0 + g + 8) * LD + c0 + t + 4];
}

// B = X^T for X[n0 .. n0+7][k0 .. k0+7]: the B operand of A X^T (S = Q K^T, dP = dO V^T).
__device__ __forceinline__ void load_bt(float (&b)[2], const float* X, int n0, int k0, int g,
                                        int t) {
    b[0] = X[(n0 + g) * LD + k0 + t];
    b[1] = X[(n0 + g) * LD + k0 + t + 4];
}

// B = X[k0 .. k0+7][n0 .. n0+7] with its rows in the order of the header's trick (k = t is
// row 2t, k = t + 4 is row 2t + 1): the B operand of P X where P is an accumulator.
__device__ __forceinline__ void load_b_paired(float (&b)[2], const float* X, int k0, int n0,
                                              int g, int t) {
    b[0] = X[(k0 + 2 * t) * LD + n0 + g];
    b[1] = X[(k0 + 2 * t + 1) * LD + n0 + g];
}

// An accumulator slice (16 x 8) as the A operand of the next product, keys paired as above.
__device__ __forceinline__ void as_a(float (&a)[4], const float (&c)[4]) {
    a[0] = c[0];
    a[1] = c[2];
    a[2] = c[1];
    a[3] = c[3];
}

// acc[n] += X_own[16 rows][HSP] Y^T for the KT rows of Y: S = Q K^T and its kin, where this
// warp's rows r0.. of X_own are the A operand, read once per 8 head dims, and each feeds the
// KT / 8 slices.
__device__ __forceinline__ void product_t(float (&acc)[KT / 8][4], const float* X, const float* Y,
                                          int r0, int g, int t) {
#pragma unroll 2
    for (int k0 = 0; k0 < HSP; k0 += 8) {
        float a[4];
        load_a(a, X, r0, k0, g, t);
        const Tf32<4> a32 = split(a);
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) {
            float b[2];
            load_bt(b, Y, 8 * n, k0, g, t);
            mma(acc[n], a32, split(b));
        }
    }
}

// acc[n] += P Y for this warp's 16 x KT accumulator P (O += P V, dQ += dS K, dV += P^T dO,
// dK += dS^T Q): each 8-key slice of P is an A operand as it is.
__device__ __forceinline__ void product_p(float (&acc)[HSP / 8][4], const float (&p)[KT / 8][4],
                                          const float* Y, int g, int t) {
#pragma unroll
    for (int j = 0; j < KT / 8; ++j) {
        float a[4];
        as_a(a, p[j]);
        const Tf32<4> a32 = split(a);
#pragma unroll
        for (int n = 0; n < HSP / 8; ++n) {
            float b[2];
            load_b_paired(b, Y, 8 * j, 8 * n, g, t);
            mma(acc[n], a32, split(b));
        }
    }
}

// Copy rows [row0, row0 + n) of a (n_rows, HS) matrix into a shared tile, zeros past the
// last row and past column HS (as flash_attention.cu's load_tile: no tail cases, no NaN).
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int n,
                                          int n_rows) {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < n * HSP; idx += NTHREADS) {
        const int r = idx / HSP, d = idx % HSP;
        const int row = row0 + r;
        tile[r * LD + d] = row < n_rows && d < HS ? src[(long long)row * HS + d] : 0.0f;
    }
}

// Write an accumulator (16 rows from row0 of the block's rows, HSP dims), times factor[half]
// for rows g (half 0) and g + 8 (half 1), to a (n_rows, HS) matrix.
__device__ __forceinline__ void store_rows(float* dst, const float (&acc)[HSP / 8][4],
                                           const float (&factor)[2], int row0, int n_rows, int g,
                                           int t) {
#pragma unroll
    for (int n = 0; n < HSP / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = row0 + g + 8 * (i / 2), d = 8 * n + 2 * t + i % 2;
            if (row < n_rows && d < HS) dst[(long long)row * HS + d] = acc[n][i] * factor[i / 2];
        }
}

// As flash_attention.cu: the scaled, biased score, or -inf where the key is hidden.
__device__ __forceinline__ float masked_score(float dot, int i, int j, int T, int S, float scale,
                                              float slope, int causal, int window) {
    const int i_abs = S - T + i;
    const bool visible = i < T && j < S && (!causal || j <= i_abs) &&
                         (window == 0 || j > i_abs - window);
    return visible ? dot * scale - slope * fabsf((float)(i_abs - j)) : NEG_INF;
}

// As flash_attention.cu: attention dropout's factor, 1 / (1 - p) or 0, for the weight of query i
// and key j of the pair bh, from splitmix64 of (seed, its index in the (B, nh, T, S) array): the
// naive path's mask on the GPU, element for element; 1 in a module built without dropout.
__device__ __forceinline__ float dropout_factor(unsigned long long seed, float p, float keep_scale,
                                                long long bh, int i, int j, int T, int S) {
    if (!DROPOUT) return 1.0f;  // a module built without dropout: every weight kept as it is
    const unsigned long long n = ((unsigned long long)bh * T + i) * S + j;
    unsigned long long z = seed + (n + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = z ^ (z >> 31);
    return (float)(z >> 40) * 5.9604644775390625e-08f >= p ? keep_scale : 0.0f;
}

// Max and sum over the four lanes that hold one row.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(FULL_MASK, x, 1);
    return x + __shfl_xor_sync(FULL_MASK, x, 2);
}

// Forward. Block (x, y) owns query rows q0 .. q0 + 63 of the pair y = b * nh + h; warp w the
// rows q0 + 16w .., lane (g, t) rows g and g + 8 of those. Per key tile of KT keys:
//   1. S = Q K^T for the warp's 16 rows (KT / 8 slices);
//   2. online softmax of each row (the lane's values, then the quad's);
//   3. acc = alpha * acc + P V, P straight from the registers.
extern "C" __launch_bounds__(NTHREADS) __global__ void flash_mma_fwd(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, float* __restrict__ o, float* __restrict__ lse, int nh,
    int n_kv, int T, int S, int hs, float scale, int causal, int window, float dropout_p,
    float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;  // heaviest causal tiles first
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);
    const float* k_kv = k + (long long)kv * S * HS;
    const float* v_kv = v + (long long)kv * S * HS;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = 16 * (threadIdx.x / 32);  // the warp's first row in the block
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    float* sQ = smem;           // [BM][LD]
    float* sK = sQ + BM * LD;   // [KT][LD]
    float* sV = sK + KT * LD;   // [KT][LD]
    load_tile(sQ, q + (long long)bh * T * HS, q0, BM, T);

    float acc[HSP / 8][4] = {};
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};  // rows g and g + 8

    const int q_last = min(q0 + BM, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    const int k_begin = window == 0 ? 0 : max(0, S - T + q0 - window + 1) / KT * KT;
    for (int k0 = k_begin; k0 < k_end; k0 += KT) {
        __syncthreads();  // every warp is done with the previous sK, sV (and sQ is in)
        load_tile(sK, k_kv, k0, KT, S);
        load_tile(sV, v_kv, k0, KT, S);
        __syncthreads();

        float s[KT / 8][4] = {};
        product_t(s, sQ, sK, r0, g, t);

        // Online softmax for rows g (half 0: s[n][0], s[n][1]) and g + 8 (half 1: [2], [3]).
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int i = q0 + r0 + g + 8 * half;
            float m_tile = NEG_INF;
#pragma unroll
            for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[n][2 * half + e];
                    x = masked_score(x, i, k0 + 8 * n + 2 * t + e, T, S, scale, slope, causal,
                                     window);
                    m_tile = fmaxf(m_tile, x);
                }
            const float m_new = fmaxf(m[half], quad_max(m_tile));
            const float m_safe = m_new == NEG_INF ? 0.0f : m_new;  // as flash_attention.cu
            const float alpha = expf(m[half] - m_safe);
            float l_tile = 0.0f;
#pragma unroll
            for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[n][2 * half + e];
                    x = expf(x - m_safe);  // from here on s holds P
                    l_tile += x;           // the softmax's sum takes P undropped,
                    x *= dropout_factor(seed, dropout_p, keep_scale, bh, i,  // P V the
                                        k0 + 8 * n + 2 * t + e, T, S);       // dropped ones
                }
            l[half] = fmaf(alpha, l[half], quad_sum(l_tile));
            m[half] = m_new;
#pragma unroll
            for (int n = 0; n < HSP / 8; ++n) {
                acc[n][2 * half] *= alpha;
                acc[n][2 * half + 1] *= alpha;
            }
        }

        product_p(acc, s, sV, g, t);  // acc += P V
    }

    float inv_l[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int i = q0 + r0 + g + 8 * half;
        if (t == 0 && i < T)
            lse[(long long)bh * T + i] = l[half] > 0.0f ? m[half] + logf(l[half]) : NEG_INF;
        inv_l[half] = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
    }
    store_rows(o + (long long)bh * T * HS, acc, inv_l, q0 + r0, T, g, t);
}

// dK and dV. Block (x, y) owns keys k0 .. k0 + 63 of the pair y = b * n_kv + kv_head; warp w
// the keys k0 + 16w ..; it walks every query head of the group and every query tile of KT
// rows that sees these keys (as flash_attention.cu's flash_attn_bwd_dkdv):
//   1. S^T = K Q^T and dP^T = V dO^T, then P^T = exp(S^T - lse) and dS^T = P^T (dP^T - D),
//      all in registers with keys as rows;
//   2. dV += P^T dO and dK += dS^T Q, both straight from the registers (dK scaled at the end).
extern "C" __launch_bounds__(NTHREADS) __global__ void flash_mma_bwd_dkdv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dk,
    float* __restrict__ dv, int nh, int n_kv, int T, int S, int hs, float scale, int causal,
    int window, float dropout_p, float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS
    const int k0 = blockIdx.x * BM;
    const int kv = blockIdx.y;
    const int b_idx = kv / n_kv;
    const int group = nh / n_kv;
    const int h_first = (kv % n_kv) * group;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int c0 = 16 * (threadIdx.x / 32);  // the warp's first key in the block

    extern __shared__ float smem[];
    float* sK = smem;            // [BM][LD]
    float* sV = sK + BM * LD;    // [BM][LD]
    float* sQ = sV + BM * LD;    // [KT][LD]
    float* sdO = sQ + KT * LD;   // [KT][LD]
    float* sLse = sdO + KT * LD; // [KT]
    float* sD = sLse + KT;       // [KT]
    load_tile(sK, k + (long long)kv * S * HS, k0, BM, S);
    load_tile(sV, v + (long long)kv * S * HS, k0, BM, S);

    float dk_acc[HSP / 8][4] = {}, dv_acc[HSP / 8][4] = {};

    const int q_begin = causal ? max(0, k0 - (S - T)) / KT * KT : 0;
    const int k1 = min(k0 + BM, S);
    const int q_end = window == 0 ? T : max(0, min(T, k1 + window - 1 - (S - T)));
    for (int h = h_first; h < h_first + group; ++h) {
        const long long bh = (long long)b_idx * nh + h;
        const float slope = slopes ? slopes[h] : 0.0f;
        for (int qt = q_begin; qt < q_end; qt += KT) {
            __syncthreads();  // every warp is done with the previous sQ, sdO, sLse, sD
            load_tile(sQ, q + bh * T * HS, qt, KT, T);
            load_tile(sdO, grad_o + bh * T * HS, qt, KT, T);
            if (threadIdx.x < KT) {
                const int i = qt + threadIdx.x;
                const float row_lse = i < T ? lse[bh * T + i] : 0.0f;
                sLse[threadIdx.x] = row_lse == NEG_INF ? 0.0f : row_lse;  // no key: P = 0
                sD[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
            }
            __syncthreads();

            // 1. Key rows c0 + g (+ 8), query columns 8n + 2t (+ 1).
            float st[KT / 8][4] = {}, dpt[KT / 8][4] = {};
            product_t(st, sK, sQ, c0, g, t);
            product_t(dpt, sV, sdO, c0, g, t);
#pragma unroll
            for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int key = k0 + c0 + g + 8 * (i / 2), r = 8 * n + 2 * t + i % 2;
                    const float s = masked_score(st[n][i], qt + r, key, T, S, scale, slope,
                                                 causal, window);
                    const float p = expf(s - sLse[r]);
                    const float z =
                        dropout_factor(seed, dropout_p, keep_scale, bh, qt + r, key, T, S);
                    st[n][i] = p * z;                         // (P * Z)^T, for dV
                    dpt[n][i] = p * (z * dpt[n][i] - sD[r]);  // dS^T
                }

            // 2. dV += P^T dO, dK += dS^T Q.
            product_p(dv_acc, st, sdO, g, t);
            product_p(dk_acc, dpt, sQ, g, t);
        }
    }

    const float scales[2] = {scale, scale}, ones[2] = {1.0f, 1.0f};  // dK = scale * dS^T Q
    store_rows(dk + (long long)kv * S * HS, dk_acc, scales, k0 + c0, S, g, t);
    store_rows(dv + (long long)kv * S * HS, dv_acc, ones, k0 + c0, S, g, t);
}

// dQ. Block (x, y) owns query rows q0 .. q0 + 63 of the pair y = b * nh + h, as the forward:
//   1. recompute S = Q K^T, P = exp(S - lse), dP = dO V^T and dS = P (dP - D) in registers;
//   2. dQ += dS K, dS straight from the registers (scaled at the end).
extern "C" __launch_bounds__(NTHREADS, DQ_MIN_BLOCKS) __global__ void flash_mma_bwd_dq(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dq, int nh,
    int n_kv, int T, int S, int hs, float scale, int causal, int window, float dropout_p,
    float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);
    const float* k_kv = k + (long long)kv * S * HS;
    const float* v_kv = v + (long long)kv * S * HS;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = 16 * (threadIdx.x / 32);
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    float* sQ = smem;            // [BM][LD]
    float* sdO = sQ + BM * LD;   // [BM][LD]
    float* sK = sdO + BM * LD;   // [KT][LD]
    float* sV = sK + KT * LD;    // [KT][LD]
    load_tile(sQ, q + (long long)bh * T * HS, q0, BM, T);
    load_tile(sdO, grad_o + (long long)bh * T * HS, q0, BM, T);
    float lse_safe[2], row_D[2];  // rows g and g + 8, read once
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int i = q0 + r0 + g + 8 * half;
        const float row_lse = i < T ? lse[(long long)bh * T + i] : 0.0f;
        lse_safe[half] = row_lse == NEG_INF ? 0.0f : row_lse;
        row_D[half] = i < T ? D[(long long)bh * T + i] : 0.0f;
    }

    float dq_acc[HSP / 8][4] = {};

    const int q_last = min(q0 + BM, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    const int k_begin = window == 0 ? 0 : max(0, S - T + q0 - window + 1) / KT * KT;
    for (int k0 = k_begin; k0 < k_end; k0 += KT) {
        __syncthreads();  // every warp is done with the previous sK, sV (and sQ, sdO are in)
        load_tile(sK, k_kv, k0, KT, S);
        load_tile(sV, v_kv, k0, KT, S);
        __syncthreads();

        float s[KT / 8][4] = {}, dp[KT / 8][4] = {};
        product_t(s, sQ, sK, r0, g, t);
        product_t(dp, sdO, sV, r0, g, t);
#pragma unroll
        for (int n = 0; n < KT / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int half = i / 2;
                const int row = q0 + r0 + g + 8 * half, key = k0 + 8 * n + 2 * t + i % 2;
                const float p = expf(masked_score(s[n][i], row, key, T, S, scale, slope, causal,
                                                  window) -
                                     lse_safe[half]);
                const float z = dropout_factor(seed, dropout_p, keep_scale, bh, row, key, T, S);
                s[n][i] = p * (z * dp[n][i] - row_D[half]);  // dS
            }

        product_p(dq_acc, s, sK, g, t);  // dQ += dS K
    }

    const float scales[2] = {scale, scale};  // dQ = scale * dS K
    store_rows(dq + (long long)bh * T * HS, dq_acc, scales, q0 + r0, T, g, t);
}
