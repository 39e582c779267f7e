// flash_attention.cu: FlashAttention-2 forward and backward for float32, as plain CUDA C.
//
// Holds four kernels, launched by flash_attention_cuda.py and checked against the NumPy twin
// flash_attention.py, which walks through the same tiles in the same order:
//   flash_attn_fwd             O and the row logsumexp, one block per (query tile, b*h)
//   flash_attn_bwd_preprocess  D = rowsum(dO * O), one warp per query row
//   flash_attn_bwd_dkdv        dK and dV, one block per (key tile, b*kv_head)
//   flash_attn_bwd_dq          dQ, one block per (query tile, b*h)
//
// Shapes (row-major, contiguous): q, o, dq, grad_o (B, nh, T, hs); k, v, dk, dv
// (B, n_kv, S, hs); lse, D (B, nh, T). Query head h reads kv head h / (nh / n_kv)
// (grouped-query attention), S >= T, and the causal mask is aligned to the end as with a KV
// cache: query i sees keys j <= (S - T) + i. A sliding window W > 0 (Mistral; causal only)
// hides the older keys too: query i then sees (S - T) + i - W < j, W keys at most, itself
// included, and key tiles wholly outside that band are skipped, so the cost is O(T * W);
// window = 0 means none. ALiBi adds -slopes[h] * |(S - T + i) - j| to the scaled scores;
// slopes may be a null pointer. Attention dropout (training, dropout_p > 0) drops each
// weight with probability p and scales the rest by 1 / (1 - p), the mask a hash of (seed, the
// weight's index in the (B, nh, T, S) array): the naive path's dropout on the GPU, element
// for element (see dropout_factor).
//
// Leaves out on purpose, for readability: tensor cores (mma / wgmma: flash_attention_mma.cu
// has them), asynchronous copies and double buffering, half precision. Every product is a
// scalar fp32 fmaf.
//
// Follows Dao, "FlashAttention-2" (2023), Algorithms 1 (forward) and 2 (backward), with the
// register tiling of a classic SIMT matrix multiply (CUTLASS's "thread tile"; Volkov and
// Demmel, "Benchmarking GPUs to tune dense linear algebra", 2008).
//
// Register tiling: why and how. An SM's shared memory delivers 32 words a cycle (32 banks),
// while the SM issues 64 (A100) to 128 (H100) fp32 FMAs a cycle, and every load instruction
// takes an issue slot too. A thread that fetches an operand of every multiply-add from
// shared memory, one float at a time, is bound by shared memory at a fraction of the FMA
// rate. Instead each thread owns a small block of every product and keeps its operands in
// registers, so that each value loaded feeds several FMAs, and it loads four neighbouring
// floats with one instruction (ld.shared.v4.f32).
//
//   Every product here is C (TILE x n) += A (TILE x k) B^T or A (TILE x TILE) B. A block of
//   (TILE / RT) x TC threads splits C so that thread (ty, tx) owns rows RT*ty .. RT*ty + 3
//   and columns tx, tx + 16, tx + 32, ... (strided, so the 16 lanes of a row read 16
//   different rows of B in different banks):
//
//     S = Q K^T, TILE = 64            per 4 head dims d .. d+3:
//                    key c ->           qf[a] = Q[RT*ty + a][d .. d+3]   4 x ld.shared.v4
//           tx=0 1 2 .. 15 0 1 .. 15    kf[b] = K[tx + 16*b][d .. d+3]   4 x ld.shared.v4
//     ty=0 [ 4 rows x 4 strided cols ]  s[a][b] += qf[a] . kf[b]          64 x fmaf
//     ty=1 [          ...            ]
//      ..                               8 loads feed 64 FMAs, not 64 loads.
//     ty=15[                         ]
//
//     O += P V (P: TILE x TILE in shared memory, V: TILE x HS)   per 4 keys c .. c+3:
//       thread (ty, tx) owns rows RT*ty + a and the dims 4*tx .. 4*tx + 3 (+ 64 at HS 128):
//         pf[a] = P[RT*ty + a][c .. c+3]      4 x ld.shared.v4
//         vf    = V[c + u][4*tx .. 4*tx + 3]  4 x ld.shared.v4 (one per key u)
//         acc[a][w] += pf[a][u] * vf[w]       64 x fmaf
//
//   The backward has the same two shapes: dP = dO V^T is a second S, dQ += dS K and
//   dV += P^T dO, dK += dS^T Q are P V products.
//
// Choices a student should know about:
// * The head size HS is a compile-time constant (-DHS=64; one module per head size, built by
//   the launcher): the loops over head dims are unrolled and the accumulators sized exactly,
//   so they stay in registers with no idle slots. Head dims are padded with zeros to a
//   multiple of 4 (HS_PAD) so float4 reads never need a tail.
// * RT = 4 rows by TC = 16 lanes: the 16 lanes that share a row are one half-warp, so the
//   online softmax's row max and row sum are four __shfl_xor_sync steps, no shared memory and
//   no __syncthreads. Each thread then owns RT x TILE/16 scores (4 x 4 at TILE 64) and
//   RT x 4 output dims per 64 of the head (4 x 4 at HS 64, 4 x 8 at HS 128).
// * TILE: 64 rows where the device's shared memory allows (an A100 or H100), 32 or 16 where
//   it does not (a T4's 64 KB); chosen per kernel by the launcher. Bigger tiles reload K and V
//   (or Q and dO) from global memory half as often, and give each thread more columns. dK/dV,
//   which holds two accumulator blocks, stops at 32: at 64 its registers would spill.
// * Row strides: LDV = HS_PAD + 4 floats and LDP = TILE + 4. A multiple of 4 keeps every row
//   16-byte aligned for float4; the extra 4 shifts consecutive rows by 4 banks, so the 8
//   lanes of a quarter-warp reading 8 strided rows (one 128-bit phase) hit 8 different
//   groups of banks instead of the same one (for head sizes that are a multiple of 8; others
//   pay a 2-way conflict).
// * Backward: dK/dV and dQ are two kernels, not one kernel with atomicAdd on dQ. The
//   atomic version recomputes nothing, but the order of its float additions changes from run
//   to run (results are not bitwise reproducible) and dQ must be zeroed first. Here each
//   block owns its outputs and writes them once; the price is that the dQ kernel recomputes
//   the score and dP tiles (about 40% more FLOPs in the backward).

// The tile height and the head size are compile-time choices made by the launcher, one module
// per (TILE, HS, DROPOUT): TILE from the device's shared memory (64, 32 or 16), HS the head size.
#ifndef TILE
#define TILE 64
#endif
#ifndef HS
#define HS 64
#endif
// 1 in the module built for attention dropout (training with dropout_p > 0): the mask code is
// compiled only there, so the kernels without it keep their registers.
#ifndef DROPOUT
#define DROPOUT 0
#endif
#define BR TILE                        // query rows per tile
#define BC TILE                        // key rows per tile
#define RT 4                           // rows of each product a thread owns
#define TC 16                          // lanes across a row: half a warp
#define NTHREADS ((TILE / RT) * TC)    // 256 at TILE 64, 128 at 32, 64 at 16: whole warps
#define SCT (TILE / TC)                // score columns per thread: 4 at TILE 64
#define HS_PAD ((HS + 3) / 4 * 4)      // head dims rounded up to whole float4s, zeros past HS
#define NG (HS_PAD / 4)                // float4 groups of the head dim
#define GPT ((NG + TC - 1) / TC)       // dim groups per thread: 1 at HS 64, 2 at HS 80 and 128
#define LDV (HS_PAD + 4)               // row stride of Q, K, V, dO tiles (see the header)
#define LDP (TILE + 4)                 // row stride of the P and dS tiles
#define FULL_MASK 0xffffffffu          // every lane of the warp takes part in a shuffle
// Blocks per SM the kernels ask registers for (__launch_bounds__): two up to HS 64, which
// caps a thread at 128 registers. Above HS 64 the accumulators hold 4 x 8 floats a product:
// ask for one block and let the compiler keep them in registers instead of spilling (at
// HS 128 a 64-row block fills over half of an H100's shared memory anyway).
#define MIN_BLOCKS (HS > 64 ? 1 : 2)
static_assert(BR == BC, "one thread grid serves query and key tiles of equal height");
static_assert(TILE % TC == 0 && TILE % RT == 0, "tiles must split evenly over the threads");
static_assert(NTHREADS % 32 == 0, "the row shuffles need whole warps");
static_assert(HS >= 1 && HS <= 128, "head sizes 1..128");
// -infinity without <math.h>, which NVRTC (CuPy's compiler) does not provide.
#define NEG_INF (-__int_as_float(0x7f800000))

// Four floats read from shared memory as one 16-byte load (ld.shared.v4.f32): the address
// must be a multiple of 16 bytes, which LDV and LDP keep. Our own type rather than CUDA's
// float4: its v[4] lets the unrolled loops index the four floats (float4 has only .x .. .w).
struct alignas(16) Vec4 {
    float v[4];
};
__device__ __forceinline__ Vec4 load4(const float* p) { return *reinterpret_cast<const Vec4*>(p); }

// Copy rows [row0, row0 + TILE) of a (n_rows, HS) matrix into a shared tile of HS_PAD
// columns and row stride LDV, writing zeros past the last row and past column HS: the tail
// tile then needs no special case, and zeros (not garbage that might be NaN) meet the zero
// probabilities of the masked keys and the padded head dims of the float4 reads.
// Consecutive threads read consecutive floats, so the global loads are coalesced.
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int n_rows) {
#pragma unroll 1  // unrolled, its loads in flight would take registers the accumulators need
    for (int idx = threadIdx.x; idx < TILE * HS_PAD; idx += NTHREADS) {
        const int r = idx / HS_PAD, d = idx % HS_PAD;
        const int row = row0 + r;
        tile[r * LDV + d] = row < n_rows && d < HS ? src[(long long)row * HS + d] : 0.0f;
    }
}

// Max and sum over the TC = 16 threads of a row group: the lanes of one half-warp, so four
// __shfl_xor_sync steps (1, 2, 4, 8) that never cross into the other half.
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
    for (int offset = 1; offset < TC; offset *= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, offset));
    return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int offset = 1; offset < TC; offset *= 2) x += __shfl_xor_sync(FULL_MASK, x, offset);
    return x;
}

// acc[a][b] += A[r0 + a] . B[tx + TC * b] over the head dims: this thread's RT x SCT block
// of A B^T (S = Q K^T, dP = dO V^T, and their transposes in dK/dV), four dims at a time.
// Each float4 of A serves SCT columns and each float4 of B serves RT rows.
__device__ __forceinline__ void dot_block(float (&acc)[RT][SCT], const float* sA,
                                          const float* sB, int r0, int tx) {
#pragma unroll 2  // more in flight would spill the accumulators at small HS
    for (int g = 0; g < NG; ++g) {
        Vec4 af[RT], bf[SCT];
#pragma unroll
        for (int a = 0; a < RT; ++a) af[a] = load4(sA + (r0 + a) * LDV + 4 * g);
#pragma unroll
        for (int b = 0; b < SCT; ++b) bf[b] = load4(sB + (tx + TC * b) * LDV + 4 * g);
#pragma unroll
        for (int a = 0; a < RT; ++a)
#pragma unroll
            for (int b = 0; b < SCT; ++b)
#pragma unroll
                for (int u = 0; u < 4; ++u) acc[a][b] = fmaf(af[a].v[u], bf[b].v[u], acc[a][b]);
    }
}

// acc[a][4e + w] += sum_c W[r0 + a][c] X[c][4 (tx + TC e) + w]: this thread's rows of W X for
// its float4 groups of head dims (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q), four
// keys c at a time: RT float4 loads of W and 4 * GPT of X for 16 * RT * GPT multiply-adds.
__device__ __forceinline__ void matmul_block(float (&acc)[RT][4 * GPT], const float* sW,
                                             const float* sX, int r0, int tx) {
#pragma unroll 2
    for (int c = 0; c < TILE; c += 4) {
        Vec4 wf[RT];
#pragma unroll
        for (int a = 0; a < RT; ++a) wf[a] = load4(sW + (r0 + a) * LDP + c);
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int e = 0; e < GPT; ++e) {
                const int g = tx + TC * e;
                if (GPT * TC == NG || g < NG) {  // e.g. HS 80: 20 groups over 16 lanes
                    const Vec4 xf = load4(sX + (c + u) * LDV + 4 * g);
#pragma unroll
                    for (int a = 0; a < RT; ++a)
#pragma unroll
                        for (int w = 0; w < 4; ++w)
                            acc[a][4 * e + w] = fmaf(wf[a].v[u], xf.v[w], acc[a][4 * e + w]);
                }
            }
    }
}

// Write rows r0 + a < n_rows of a register block, times `factor`, to a (n_rows, HS) matrix
// starting at row0: the dims this thread owns that lie below HS.
__device__ __forceinline__ void store_block(float* dst, const float (&acc)[RT][4 * GPT],
                                            const float (&factor)[RT], int row0, int n_rows,
                                            int r0, int tx) {
#pragma unroll
    for (int a = 0; a < RT; ++a) {
        const int row = row0 + r0 + a;
        if (row >= n_rows) continue;
#pragma unroll
        for (int e = 0; e < GPT; ++e)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int d = 4 * (tx + TC * e) + w;
                if (d < HS) dst[(long long)row * HS + d] = acc[a][4 * e + w] * factor[a];
            }
    }
}

// Scaled score of query i (0-based among the T queries) and key j, with the ALiBi bias and
// the masks applied: keys past S, queries past T, if causal keys after the query and, with
// a window W > 0, keys W or more positions before it.
__device__ __forceinline__ float masked_score(float dot, int i, int j, int T, int S, float scale,
                                              float slope, int causal, int window) {
    const int i_abs = S - T + i;  // the query's position among the keys
    const bool visible = i < T && j < S && (!causal || j <= i_abs) &&
                         (window == 0 || j > i_abs - window);
    return visible ? dot * scale - slope * fabsf((float)(i_abs - j)) : NEG_INF;
}

// Attention dropout's factor for the weight of query i and key j of the pair bh = b * nh + h:
// 1 / (1 - p) (`keep_scale`) if kept, 0 if dropped. Kept means u >= p for the uniform u of
// splitmix64 at the weight's index n in the (B, nh, T, S) array, (seed + (n + 1) * step mixed,
// its top 24 bits times 2^-24): minigrad/kernels/fused.py's minigrad_keep, which the naive
// path's dropout runs, so both paths drop the same weights. With dropout:
//   forward   O = (P * Z) V, while l and lse sum the undropped P (Z: these factors);
//   backward  dV = (P * Z)^T dO,  dS = P * (Z * dP - D),  D = rowsum(dO * O) as before.
// In a module built without dropout (DROPOUT 0) it is 1, a constant the compiler folds away.
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

// The first key tile that any query of the tile starting at q0 sees: 0 without a window;
// with one, the tile holding key (S - T) + q0 - W + 1, the oldest key its first query sees.
// Earlier tiles lie wholly behind the band and are skipped (as the twin's k_start).
__device__ __forceinline__ int first_key_tile(int q0, int T, int S, int window) {
    return window == 0 ? 0 : max(0, S - T + q0 - window + 1) / BC * BC;
}

// Forward. Block (x, y) owns query tile x of the (batch, head) pair y = b * nh + h; thread
// (ty, tx) = (tid / TC, tid % TC) owns query rows r0 + a = RT * ty + a. Per key tile:
//   1. S = Q K^T for its RT x SCT block, in registers;
//   2. online softmax per row: new row max m, rescale factor alpha, P = exp(S - m) into
//      shared memory;
//   3. acc = alpha * acc + P V for its rows and dims.
extern "C" __launch_bounds__(NTHREADS, MIN_BLOCKS) __global__ void flash_attn_fwd(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, float* __restrict__ o, float* __restrict__ lse, int nh,
    int n_kv, int T, int S, int hs, float scale, int causal, int window, float dropout_p,
    float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS: the launcher builds one module per head size
    // Causal tiles near the end of the sequence see the most keys: start them first so the
    // short ones fill the gaps at the end of the launch.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);  // b * n_kv + kv_head
    const float* k_kv = k + (long long)kv * S * HS;
    const float* v_kv = v + (long long)kv * S * HS;
    const int tx = threadIdx.x % TC, r0 = RT * (threadIdx.x / TC);
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    float* sQ = smem;            // [BR][LDV]
    float* sK = sQ + BR * LDV;   // [BC][LDV]
    float* sV = sK + BC * LDV;   // [BC][LDV]
    float* sP = sV + BC * LDV;   // [BR][LDP]
    load_tile(sQ, q + (long long)bh * T * HS, q0, T);

    float acc[RT][4 * GPT];  // output rows r0 + a, dims 4 * (tx + TC * e) + w
    float m[RT], l[RT];      // per row: running max of the scores, running sum of exp(s - m)
#pragma unroll
    for (int a = 0; a < RT; ++a) {
        m[a] = NEG_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int d = 0; d < 4 * GPT; ++d) acc[a][d] = 0.0f;
    }

    // Causal: the last query of the tile sees keys up to S - T + q_last; later tiles are skipped,
    // and with a window so are those before the band of its first query.
    const int q_last = min(q0 + BR, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    for (int k0 = first_key_tile(q0, T, S, window); k0 < k_end; k0 += BC) {
        __syncthreads();  // every thread is done with the previous sK, sV, sP (and sQ is in)
        load_tile(sK, k_kv, k0, S);
        load_tile(sV, v_kv, k0, S);
        __syncthreads();

        // 1. Scores for this thread's block: rows r0 + a, key columns tx + TC * b.
        float s[RT][SCT] = {};
        dot_block(s, sQ, sK, r0, tx);

        // 2. Online softmax, row by row. alpha re-bases the old sum and accumulator on the
        // new max.
#pragma unroll
        for (int a = 0; a < RT; ++a) {
            float m_tile = NEG_INF;
#pragma unroll
            for (int b = 0; b < SCT; ++b) {
                s[a][b] = masked_score(s[a][b], q0 + r0 + a, k0 + tx + TC * b, T, S, scale, slope,
                                       causal, window);
                m_tile = fmaxf(m_tile, s[a][b]);
            }
            const float m_new = fmaxf(m[a], row_max(m_tile));
            // subtle: while a row has seen no visible key, m_new = -inf and s - m_new would be
            // -inf - -inf = NaN; re-basing on 0 gives p = 0 and alpha = 0, which is the truth.
            const float m_safe = m_new == NEG_INF ? 0.0f : m_new;
            const float alpha = expf(m[a] - m_safe);
            float l_tile = 0.0f;
#pragma unroll
            for (int b = 0; b < SCT; ++b) {
                const float p = expf(s[a][b] - m_safe);
                const float z = dropout_factor(seed, dropout_p, keep_scale, bh, q0 + r0 + a,
                                               k0 + tx + TC * b, T, S);
                sP[(r0 + a) * LDP + tx + TC * b] = p * z;  // P V takes the dropped weights
                l_tile += p;                               // the softmax's sum does not
            }
            l[a] = fmaf(alpha, l[a], row_sum(l_tile));
            m[a] = m_new;
#pragma unroll
            for (int d = 0; d < 4 * GPT; ++d) acc[a][d] *= alpha;
        }
        __syncthreads();  // the whole P tile is in shared memory

        // 3. acc += P V.
        matmul_block(acc, sP, sV, r0, tx);
    }

    // A row that saw no key (l = 0) gets o = 0 and lse = -inf instead of NaN.
#pragma unroll
    for (int a = 0; a < RT; ++a) {
        const int i = q0 + r0 + a;
        if (tx == 0 && i < T)
            lse[(long long)bh * T + i] = l[a] > 0.0f ? m[a] + logf(l[a]) : NEG_INF;
        l[a] = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;  // from here on, 1 / l
    }
    store_block(o + (long long)bh * T * HS, acc, l, q0, T, r0, tx);
}

// D[row] = sum_d dO[row, d] * O[row, d] over the B * nh * T rows: one warp per row, each
// lane summing a strided slice (coalesced), then a shuffle tree adds the 32 partial sums.
extern "C" __global__ void flash_attn_bwd_preprocess(const float* __restrict__ o,
                                                     const float* __restrict__ grad_o,
                                                     float* __restrict__ D, int n_rows, int hs) {
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= n_rows) return;  // the whole warp leaves together, so the shuffles stay full
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32) acc = fmaf(grad_o[row * hs + d], o[row * hs + d], acc);
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(FULL_MASK, acc, offset);
    if (lane == 0) D[row] = acc;
}

// dK and dV. Block (x, y) owns key tile x of the pair y = b * n_kv + kv_head, keeps its K and
// V tiles in shared memory, and loops over every query head of the group and every query
// tile that can see these keys. Thread (ty, tx) owns key rows c0 + a = RT * ty + a: the
// products are the forward's with keys and queries swapped.
//   1. S^T = K Q^T and dP^T = V dO^T for its block (query columns tx + TC * b), then
//      p = exp(s - lse) and ds = p * (dp - D) into shared P^T and dS^T;
//   2. dV += P^T dO and dK += dS^T Q, in registers (dK scaled once at the end).
// Summing over the group's heads inside the block gives dK, dV for the shared kv head
// without ever repeating K or V.
extern "C" __launch_bounds__(NTHREADS, MIN_BLOCKS) __global__ void flash_attn_bwd_dkdv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dk,
    float* __restrict__ dv, int nh, int n_kv, int T, int S, int hs, float scale, int causal,
    int window, float dropout_p, float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS
    const int k0 = blockIdx.x * BC;
    const int kv = blockIdx.y;  // b * n_kv + kv_head
    const int b_idx = kv / n_kv;
    const int group = nh / n_kv;
    const int h_first = (kv % n_kv) * group;  // the query heads h_first .. h_first + group - 1
    const int tx = threadIdx.x % TC, c0 = RT * (threadIdx.x / TC);

    extern __shared__ float smem[];
    float* sK = smem;                // [BC][LDV]
    float* sV = sK + BC * LDV;       // [BC][LDV]
    float* sQ = sV + BC * LDV;       // [BR][LDV]
    float* sdO = sQ + BR * LDV;      // [BR][LDV]
    float* sPt = sdO + BR * LDV;     // [BC][LDP]  P transposed: key rows, query columns
    float* sdSt = sPt + BC * LDP;    // [BC][LDP]  dS transposed
    float* sLse = sdSt + BC * LDP;   // [BR]
    float* sD = sLse + BR;           // [BR]
    load_tile(sK, k + (long long)kv * S * HS, k0, S);
    load_tile(sV, v + (long long)kv * S * HS, k0, S);

    float dk_acc[RT][4 * GPT] = {}, dv_acc[RT][4 * GPT] = {};

    // Causal: query i sees key k0 only if i >= k0 - (S - T); earlier query tiles are skipped.
    // Window: the tile's last key, k1 - 1, is seen by queries up to absolute position
    // k1 + W - 2 only; later query tiles are skipped (as the twin's q_end).
    const int q_begin = causal ? max(0, k0 - (S - T)) / BR * BR : 0;
    const int k1 = min(k0 + BC, S);
    const int q_end = window == 0 ? T : max(0, min(T, k1 + window - 1 - (S - T)));
    for (int h = h_first; h < h_first + group; ++h) {
        const long long bh = (long long)b_idx * nh + h;
        const float slope = slopes ? slopes[h] : 0.0f;
        for (int q0 = q_begin; q0 < q_end; q0 += BR) {
            __syncthreads();  // every thread is done with the previous sQ, sdO, sPt, sdSt
            load_tile(sQ, q + bh * T * HS, q0, T);
            load_tile(sdO, grad_o + bh * T * HS, q0, T);
            if (threadIdx.x < BR) {
                const int i = q0 + threadIdx.x;
                const float row_lse = i < T ? lse[bh * T + i] : 0.0f;
                // A row that saw no key has lse = -inf and P = 0; 0 keeps exp from a NaN.
                sLse[threadIdx.x] = row_lse == NEG_INF ? 0.0f : row_lse;
                sD[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
            }
            __syncthreads();

            // 1. This thread's block of P^T and dS^T: key rows c0 + a, query columns r.
            float st[RT][SCT] = {}, dpt[RT][SCT] = {};
            dot_block(st, sK, sQ, c0, tx);
            dot_block(dpt, sV, sdO, c0, tx);
#pragma unroll
            for (int a = 0; a < RT; ++a)
#pragma unroll
                for (int b = 0; b < SCT; ++b) {
                    const int r = tx + TC * b;
                    const float s = masked_score(st[a][b], q0 + r, k0 + c0 + a, T, S, scale,
                                                 slope, causal, window);
                    const float p = expf(s - sLse[r]);  // masked: exp(-inf) = 0
                    const float z = dropout_factor(seed, dropout_p, keep_scale, bh, q0 + r,
                                                   k0 + c0 + a, T, S);
                    sPt[(c0 + a) * LDP + r] = p * z;
                    sdSt[(c0 + a) * LDP + r] = p * (z * dpt[a][b] - sD[r]);
                }
            __syncthreads();  // the whole P^T and dS^T tiles are in shared memory

            // 2. dV[c] += sum_r P[r, c] dO[r],  dK[c] += sum_r dS[r, c] Q[r]  (scale later).
            matmul_block(dv_acc, sPt, sdO, c0, tx);
            matmul_block(dk_acc, sdSt, sQ, c0, tx);
        }
    }

    float ones[RT], scales[RT];
#pragma unroll
    for (int a = 0; a < RT; ++a) ones[a] = 1.0f, scales[a] = scale;  // dK = scale * dS^T Q
    store_block(dk + (long long)kv * S * HS, dk_acc, scales, k0, S, c0, tx);
    store_block(dv + (long long)kv * S * HS, dv_acc, ones, k0, S, c0, tx);
}

// dQ. Block (x, y) owns query tile x of the pair y = b * nh + h, shaped like the forward:
// thread (ty, tx) owns query rows r0 + a = RT * ty + a.
//   1. recompute S = Q K^T and P = exp(S - lse) for its block, dP = dO V^T, and write
//      dS = P * (dP - D) to shared memory;
//   2. dQ += dS K for its rows and dims (scaled once at the end).
extern "C" __launch_bounds__(NTHREADS, MIN_BLOCKS) __global__ void flash_attn_bwd_dq(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dq, int nh,
    int n_kv, int T, int S, int hs, float scale, int causal, int window, float dropout_p,
    float keep_scale, unsigned long long seed) {
    (void)hs;  // equals HS
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // heaviest causal tiles first
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);
    const float* k_kv = k + (long long)kv * S * HS;
    const float* v_kv = v + (long long)kv * S * HS;
    const int tx = threadIdx.x % TC, r0 = RT * (threadIdx.x / TC);
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    float* sQ = smem;             // [BR][LDV]
    float* sdO = sQ + BR * LDV;   // [BR][LDV]
    float* sK = sdO + BR * LDV;   // [BC][LDV]
    float* sV = sK + BC * LDV;    // [BC][LDV]
    float* sdS = sV + BC * LDV;   // [BR][LDP]
    load_tile(sQ, q + (long long)bh * T * HS, q0, T);
    load_tile(sdO, grad_o + (long long)bh * T * HS, q0, T);
    // Each thread reads its rows' statistics once, into registers.
    float lse_safe[RT], row_D[RT];
#pragma unroll
    for (int a = 0; a < RT; ++a) {
        const int i = q0 + r0 + a;
        const float row_lse = i < T ? lse[(long long)bh * T + i] : 0.0f;
        lse_safe[a] = row_lse == NEG_INF ? 0.0f : row_lse;  // no key: P = 0, not NaN
        row_D[a] = i < T ? D[(long long)bh * T + i] : 0.0f;
    }

    float dq_acc[RT][4 * GPT] = {};

    const int q_last = min(q0 + BR, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    for (int k0 = first_key_tile(q0, T, S, window); k0 < k_end; k0 += BC) {
        __syncthreads();  // every thread is done with the previous sK, sV, sdS
        load_tile(sK, k_kv, k0, S);
        load_tile(sV, v_kv, k0, S);
        __syncthreads();

        // 1. dS for this thread's block: rows r0 + a, key columns tx + TC * b.
        float s[RT][SCT] = {}, dp[RT][SCT] = {};
        dot_block(s, sQ, sK, r0, tx);
        dot_block(dp, sdO, sV, r0, tx);
#pragma unroll
        for (int a = 0; a < RT; ++a)
#pragma unroll
            for (int b = 0; b < SCT; ++b) {
                const int c = tx + TC * b;
                const float p = expf(masked_score(s[a][b], q0 + r0 + a, k0 + c, T, S, scale,
                                                  slope, causal, window) -
                                     lse_safe[a]);
                const float z = dropout_factor(seed, dropout_p, keep_scale, bh, q0 + r0 + a,
                                               k0 + c, T, S);
                sdS[(r0 + a) * LDP + c] = p * (z * dp[a][b] - row_D[a]);
            }
        __syncthreads();  // the whole dS tile is in shared memory

        // 2. dQ[r] += sum_c dS[r, c] K[c].
        matmul_block(dq_acc, sdS, sK, r0, tx);
    }

    float scales[RT];
#pragma unroll
    for (int a = 0; a < RT; ++a) scales[a] = scale;  // dQ = scale * dS K
    store_block(dq + (long long)bh * T * HS, dq_acc, scales, q0, T, r0, tx);
}
