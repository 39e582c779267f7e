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
// slopes may be a null pointer.
//
// Leaves out on purpose, for readability: tensor cores (mma / wgmma), vector (float4) loads,
// asynchronous copies and double buffering, half precision, dropout. Every product is scalar
// fp32 FMA from shared memory, so this is the algorithm, not the speed, of FlashAttention.
//
// Follows Dao, "FlashAttention-2" (2023), Algorithms 1 (forward) and 2 (backward).
//
// Choices a student should know about:
// * The head size is a runtime argument up to HS_MAX = 128, not a template parameter. Each
//   thread keeps HS_MAX / TPR accumulator slots and skips those with d >= hs; the loops over
//   slots are unrolled so the accumulators stay in registers. One source, no template
//   instantiation, at the cost of some idle registers for small heads.
// * Tiles: BR = BC = TILE = 32 rows (16 where shared memory is short), TPR = 4 threads per
//   row, so a block has 128 threads (four warps; two at TILE 16). The four threads of a row are neighbouring lanes of one warp, so a row's max and
//   sum are two __shfl_xor_sync steps, with no shared memory and no __syncthreads.
// * Tiles live in dynamic shared memory with a row stride of hs rounded up to an odd number
//   (hs | 1): rows that start in different banks let the 8 rows a warp reads at once be
//   served in one pass instead of colliding on the same bank. At hs = 128 a block needs 52.5 KB
//   (forward) to 73 KB (dK/dV), above the 48 KB default: the launcher opts in to more where
//   the GPU allows it, and otherwise builds the kernel with 16-row tiles (a T4 allows 64 KB).
// * Backward: dK/dV and dQ are two kernels, not one kernel with atomicAdd on dQ. The
//   atomic version recomputes nothing, but the order of its float additions changes from run
//   to run (results are not bitwise reproducible) and dQ must be zeroed first. Here each
//   block owns its outputs and writes them once; the price is that the dQ kernel recomputes
//   the score and dP tiles (about 40% more FLOPs in the backward).

// The tile height is a compile-time choice (-DTILE=16) made by the launcher from the device's
// shared memory; 32 unless told otherwise.
#ifndef TILE
#define TILE 32
#endif
#define BR TILE                // query rows per tile
#define BC TILE                // key rows per tile
#define TPR 4                  // threads that cooperate on one row
#define NTHREADS (BR * TPR)    // 128 threads per block at TILE 32; BR == BC, one count serves all
#define HS_MAX 128             // the largest head size the fixed register arrays can hold
#define DPT (HS_MAX / TPR)     // head-dim slots per thread: d = lane + TPR * t, t < DPT
#define CPT (BC / TPR)         // score columns per thread: c = lane + TPR * t, t < CPT
#define FULL_MASK 0xffffffffu  // every lane of the warp takes part in a shuffle
static_assert(BR == BC, "load_tile and the launch assume query and key tiles of equal height");
// -infinity without <math.h>, which NVRTC (CuPy's compiler) does not provide.
#define NEG_INF (-__int_as_float(0x7f800000))

// Shared-memory row stride: hs rounded up to an odd number of floats (see the header).
__device__ __forceinline__ int padded_stride(int hs) { return hs | 1; }

// Copy rows [row0, row0 + BR) of a (n_rows, hs) matrix into a shared tile with row stride
// ld, writing zeros past the last row: the tail tile then needs no special case, and zeros
// (not garbage that might be NaN) meet the zero probabilities of the masked keys.
// Consecutive threads read consecutive floats, so the global loads are coalesced.
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int n_rows,
                                          int hs, int ld) {
    for (int idx = threadIdx.x; idx < BR * hs; idx += NTHREADS) {
        const int r = idx / hs, d = idx % hs;
        const int row = row0 + r;
        tile[r * ld + d] = row < n_rows ? src[(long long)row * hs + d] : 0.0f;
    }
}

// Sum and max over the TPR = 4 threads of a row: lanes 4r .. 4r + 3 of the same warp.
__device__ __forceinline__ float row_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 2));
}
__device__ __forceinline__ float row_sum(float x) {
    x += __shfl_xor_sync(FULL_MASK, x, 1);
    return x + __shfl_xor_sync(FULL_MASK, x, 2);
}

// Dot product of two shared-memory rows of length hs.
__device__ __forceinline__ float dot_rows(const float* a, const float* b, int hs) {
    float acc = 0.0f;
    for (int d = 0; d < hs; ++d) acc += a[d] * b[d];
    return acc;
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

// The first key tile that any query of the tile starting at q0 sees: 0 without a window;
// with one, the tile holding key (S - T) + q0 - W + 1, the oldest key its first query sees.
// Earlier tiles lie wholly behind the band and are skipped (as the twin's k_start).
__device__ __forceinline__ int first_key_tile(int q0, int T, int S, int window) {
    return window == 0 ? 0 : max(0, S - T + q0 - window + 1) / BC * BC;
}

// Forward. Block (x, y) owns query tile x of the (batch, head) pair y = b * nh + h.
// Thread tid works on row r = tid / TPR of the tile with lane = tid % TPR: score columns
// c = lane + TPR * t and output dims d = lane + TPR * t. Per key tile:
//   1. S = Q K^T for this thread's columns, kept in registers;
//   2. online softmax: new row max m, rescale factor alpha, P = exp(S - m) into shared memory;
//   3. acc = alpha * acc + P V for this thread's dims.
extern "C" __global__ void flash_attn_fwd(const float* __restrict__ q,
                                          const float* __restrict__ k,
                                          const float* __restrict__ v,
                                          const float* __restrict__ slopes, float* __restrict__ o,
                                          float* __restrict__ lse, int nh, int n_kv, int T, int S,
                                          int hs, float scale, int causal, int window) {
    // Causal tiles near the end of the sequence see the most keys: start them first so the
    // short ones fill the gaps at the end of the launch.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);  // b * n_kv + kv_head
    const float* q_bh = q + (long long)bh * T * hs;
    const float* k_kv = k + (long long)kv * S * hs;
    const float* v_kv = v + (long long)kv * S * hs;
    const int r = threadIdx.x / TPR, lane = threadIdx.x % TPR;
    const int i = q0 + r;
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    const int ld = padded_stride(hs);
    float* sQ = smem;           // [BR][ld]
    float* sK = sQ + BR * ld;   // [BC][ld]
    float* sV = sK + BC * ld;   // [BC][ld]
    float* sP = sV + BC * ld;   // [BR][BC + 1], +1 so the rows start in different banks
    load_tile(sQ, q_bh, q0, T, hs, ld);

    float acc[DPT];
#pragma unroll
    for (int t = 0; t < DPT; ++t) acc[t] = 0.0f;
    float m = NEG_INF;  // running max of this row's scores
    float l = 0.0f;     // running sum of exp(score - m)

    // Causal: the last query of the tile sees keys up to S - T + q_last; later tiles are skipped,
    // and with a window so are those before the band of its first query.
    const int q_last = min(q0 + BR, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    for (int k0 = first_key_tile(q0, T, S, window); k0 < k_end; k0 += BC) {
        __syncthreads();  // every thread is done with the previous sK, sV, sP (and sQ is in)
        load_tile(sK, k_kv, k0, S, hs, ld);
        load_tile(sV, v_kv, k0, S, hs, ld);
        __syncthreads();

        // 1. Scores for this thread's CPT columns.
        float s[CPT];
        float m_tile = NEG_INF;
#pragma unroll
        for (int t = 0; t < CPT; ++t) {
            const int c = lane + TPR * t;
            const float dot = dot_rows(sQ + r * ld, sK + c * ld, hs);
            s[t] = masked_score(dot, i, k0 + c, T, S, scale, slope, causal, window);
            m_tile = fmaxf(m_tile, s[t]);
        }
        // 2. Online softmax. alpha re-bases the old sum and accumulator on the new max.
        const float m_new = fmaxf(m, row_max(m_tile));
        // subtle: while a row has seen no visible key, m_new = -inf and s - m_new would be
        // -inf - -inf = NaN; re-basing on 0 gives p = 0 and alpha = 0, which is the truth.
        const float m_safe = m_new == NEG_INF ? 0.0f : m_new;
        const float alpha = expf(m - m_safe);
        float l_tile = 0.0f;
#pragma unroll
        for (int t = 0; t < CPT; ++t) {
            const float p = expf(s[t] - m_safe);
            sP[r * (BC + 1) + lane + TPR * t] = p;
            l_tile += p;
        }
        l = alpha * l + row_sum(l_tile);
        m = m_new;
        __syncthreads();  // the whole P tile is in shared memory

        // 3. acc = alpha * acc + P V, for this thread's dims of the row. The loop over keys
        // is outside so each p is read once; the unrolled loop over the DPT slots inside
        // keeps acc in registers (a runtime index would push it out to local memory).
#pragma unroll
        for (int t = 0; t < DPT; ++t) acc[t] *= alpha;
#pragma unroll 2
        for (int c = 0; c < BC; ++c) {
            const float p = sP[r * (BC + 1) + c];
#pragma unroll
            for (int t = 0; t < DPT; ++t) {
                const int d = lane + TPR * t;
                if (d < hs) acc[t] += p * sV[c * ld + d];
            }
        }
    }

    if (i < T) {
        // A row that saw no key (l = 0) gets o = 0 and lse = -inf instead of NaN.
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
        float* o_row = o + ((long long)bh * T + i) * hs;
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
            const int d = lane + TPR * t;
            if (d < hs) o_row[d] = acc[t] * inv_l;
        }
        if (lane == 0) lse[(long long)bh * T + i] = l > 0.0f ? m + logf(l) : NEG_INF;
    }
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
    for (int d = lane; d < hs; d += 32) acc += grad_o[row * hs + d] * o[row * hs + d];
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(FULL_MASK, acc, offset);
    if (lane == 0) D[row] = acc;
}

// dK and dV. Block (x, y) owns key tile x of the pair y = b * n_kv + kv_head, keeps its K and
// V tiles in shared memory, and loops over every query head of the group and every query
// tile that can see these keys. Thread tid works on key row c = tid / TPR with
// lane = tid % TPR: query rows r = lane + TPR * t in step 1, dims d = lane + TPR * t in step 2.
//   1. P^T and dS^T for the tile: p = exp(s - lse), dp = dO . v, ds = p * (dp - D);
//   2. dV += P^T dO and dK += dS^T Q, in registers (scaled once at the end).
// Summing over the group's heads inside the block gives dK, dV for the shared kv head
// without ever repeating K or V.
extern "C" __global__ void flash_attn_bwd_dkdv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dk,
    float* __restrict__ dv, int nh, int n_kv, int T, int S, int hs, float scale, int causal,
    int window) {
    const int k0 = blockIdx.x * BC;
    const int kv = blockIdx.y;  // b * n_kv + kv_head
    const int b = kv / n_kv;
    const int group = nh / n_kv;
    const int h_first = (kv % n_kv) * group;  // the query heads h_first .. h_first + group - 1
    const int c = threadIdx.x / TPR, lane = threadIdx.x % TPR;
    const int j = k0 + c;

    extern __shared__ float smem[];
    const int ld = padded_stride(hs);
    float* sK = smem;               // [BC][ld]
    float* sV = sK + BC * ld;       // [BC][ld]
    float* sQ = sV + BC * ld;       // [BR][ld]
    float* sdO = sQ + BR * ld;      // [BR][ld]
    float* sPt = sdO + BR * ld;     // [BC][BR + 1]  P transposed: key rows, query columns
    float* sdSt = sPt + BC * (BR + 1);  // [BC][BR + 1]  dS transposed
    float* sLse = sdSt + BC * (BR + 1);  // [BR]
    float* sD = sLse + BR;               // [BR]
    load_tile(sK, k + (long long)kv * S * hs, k0, S, hs, ld);
    load_tile(sV, v + (long long)kv * S * hs, k0, S, hs, ld);

    float dk_acc[DPT], dv_acc[DPT];
#pragma unroll
    for (int t = 0; t < DPT; ++t) dk_acc[t] = dv_acc[t] = 0.0f;

    // Causal: query i sees key k0 only if i >= k0 - (S - T); earlier query tiles are skipped.
    // Window: the tile's last key, k1 - 1, is seen by queries up to absolute position
    // k1 + W - 2 only; later query tiles are skipped (as the twin's q_end).
    const int q_begin = causal ? max(0, k0 - (S - T)) / BR * BR : 0;
    const int k1 = min(k0 + BC, S);
    const int q_end = window == 0 ? T : max(0, min(T, k1 + window - 1 - (S - T)));
    for (int h = h_first; h < h_first + group; ++h) {
        const long long bh = (long long)b * nh + h;
        const float slope = slopes ? slopes[h] : 0.0f;
        for (int q0 = q_begin; q0 < q_end; q0 += BR) {
            __syncthreads();  // every thread is done with the previous sQ, sdO, sPt, sdSt
            load_tile(sQ, q + bh * T * hs, q0, T, hs, ld);
            load_tile(sdO, grad_o + bh * T * hs, q0, T, hs, ld);
            if (threadIdx.x < BR) {
                const int i = q0 + threadIdx.x;
                const float row_lse = i < T ? lse[bh * T + i] : 0.0f;
                // A row that saw no key has lse = -inf and P = 0; 0 keeps exp from a NaN.
                sLse[threadIdx.x] = row_lse == NEG_INF ? 0.0f : row_lse;
                sD[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
            }
            __syncthreads();

            // 1. This thread's entries of P^T and dS^T (key row c, query columns r).
#pragma unroll
            for (int t = 0; t < BR / TPR; ++t) {
                const int r = lane + TPR * t;
                const float dot = dot_rows(sQ + r * ld, sK + c * ld, hs);
                const float s = masked_score(dot, q0 + r, j, T, S, scale, slope, causal, window);
                const float p = expf(s - sLse[r]);  // masked: exp(-inf) = 0
                const float dp = dot_rows(sdO + r * ld, sV + c * ld, hs);
                sPt[c * (BR + 1) + r] = p;
                sdSt[c * (BR + 1) + r] = p * (dp - sD[r]);
            }
            __syncthreads();  // the whole row c of P^T and dS^T is in shared memory

            // 2. dV[c] += sum_r P[r, c] dO[r],  dK[c] += sum_r dS[r, c] Q[r]  (scale later).
#pragma unroll 2
            for (int r = 0; r < BR; ++r) {
                const float p = sPt[c * (BR + 1) + r];
                const float ds = sdSt[c * (BR + 1) + r];
#pragma unroll
                for (int t = 0; t < DPT; ++t) {
                    const int d = lane + TPR * t;
                    if (d < hs) {
                        dv_acc[t] += p * sdO[r * ld + d];
                        dk_acc[t] += ds * sQ[r * ld + d];
                    }
                }
            }
        }
    }

    if (j < S) {
        float* dk_row = dk + ((long long)kv * S + j) * hs;
        float* dv_row = dv + ((long long)kv * S + j) * hs;
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
            const int d = lane + TPR * t;
            if (d < hs) {
                dk_row[d] = dk_acc[t] * scale;  // dK = scale * dS^T Q
                dv_row[d] = dv_acc[t];
            }
        }
    }
}

// dQ. Block (x, y) owns query tile x of the pair y = b * nh + h, shaped like the forward:
// thread tid works on query row r = tid / TPR, key columns and dims lane + TPR * t.
//   1. recompute s and p = exp(s - lse) for this thread's columns, dp = dO . v,
//      and write dS = p * (dp - D) to shared memory;
//   2. dQ += dS K for this thread's dims (scaled once at the end).
extern "C" __global__ void flash_attn_bwd_dq(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ slopes, const float* __restrict__ grad_o,
    const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dq, int nh,
    int n_kv, int T, int S, int hs, float scale, int causal, int window) {
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BR;  // heaviest causal tiles first
    const int bh = blockIdx.y;
    const int h = bh % nh;
    const int kv = (bh / nh) * n_kv + h / (nh / n_kv);
    const float* k_kv = k + (long long)kv * S * hs;
    const float* v_kv = v + (long long)kv * S * hs;
    const int r = threadIdx.x / TPR, lane = threadIdx.x % TPR;
    const int i = q0 + r;
    const float slope = slopes ? slopes[h] : 0.0f;

    extern __shared__ float smem[];
    const int ld = padded_stride(hs);
    float* sQ = smem;            // [BR][ld]
    float* sdO = sQ + BR * ld;   // [BR][ld]
    float* sK = sdO + BR * ld;   // [BC][ld]
    float* sV = sK + BC * ld;    // [BC][ld]
    float* sdS = sV + BC * ld;   // [BR][BC + 1]
    load_tile(sQ, q + (long long)bh * T * hs, q0, T, hs, ld);
    load_tile(sdO, grad_o + (long long)bh * T * hs, q0, T, hs, ld);
    // Every thread of the row reads the row's statistics once, into registers.
    const float row_lse = i < T ? lse[(long long)bh * T + i] : 0.0f;
    const float lse_safe = row_lse == NEG_INF ? 0.0f : row_lse;  // no key: P = 0, not NaN
    const float row_D = i < T ? D[(long long)bh * T + i] : 0.0f;

    float dq_acc[DPT];
#pragma unroll
    for (int t = 0; t < DPT; ++t) dq_acc[t] = 0.0f;

    const int q_last = min(q0 + BR, T) - 1;
    const int k_end = causal ? min(S, S - T + q_last + 1) : S;
    for (int k0 = first_key_tile(q0, T, S, window); k0 < k_end; k0 += BC) {
        __syncthreads();  // every thread is done with the previous sK, sV, sdS
        load_tile(sK, k_kv, k0, S, hs, ld);
        load_tile(sV, v_kv, k0, S, hs, ld);
        __syncthreads();

        // 1. dS for this thread's columns.
#pragma unroll
        for (int t = 0; t < CPT; ++t) {
            const int c = lane + TPR * t;
            const float dot = dot_rows(sQ + r * ld, sK + c * ld, hs);
            const float p =
                expf(masked_score(dot, i, k0 + c, T, S, scale, slope, causal, window) - lse_safe);
            const float dp = dot_rows(sdO + r * ld, sV + c * ld, hs);
            sdS[r * (BC + 1) + c] = p * (dp - row_D);
        }
        __syncthreads();  // the whole dS tile is in shared memory

        // 2. dQ[r] += sum_c dS[r, c] K[c].
#pragma unroll 2
        for (int c = 0; c < BC; ++c) {
            const float ds = sdS[r * (BC + 1) + c];
#pragma unroll
            for (int t = 0; t < DPT; ++t) {
                const int d = lane + TPR * t;
                if (d < hs) dq_acc[t] += ds * sK[c * ld + d];
            }
        }
    }

    if (i < T) {
        float* dq_row = dq + ((long long)bh * T + i) * hs;
#pragma unroll
        for (int t = 0; t < DPT; ++t) {
            const int d = lane + TPR * t;
            if (d < hs) dq_row[d] = dq_acc[t] * scale;  // dQ = scale * dS K
        }
    }
}
