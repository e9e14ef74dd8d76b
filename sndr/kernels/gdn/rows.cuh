// The GDN state rows in registers, shared by PK0003's fused step (step.cu) and PK0004's replayed
// verify (replay.cu), which `#include` it (expanded by sndr/kernels/_cudart.read_source, so the
// cubin cache's key covers it): the dtype conversions, the warp and row reductions, a token's q/k
// normalisation (`norm_qk`), the state rows' loads and stores, and one token of the delta rule (`pass`).
//
// Layout: thread (g, p) owns R rows of a [rows, K] state tile (rows g R .. g R + R - 1) and, in
// each, the 16-byte chunks c = p, p + P, p + 2P, ... (C = K / P columns): E = R * C float32 values
// in registers, S[i * C + j * EPC + e] = element (p + P j) EPC + e of row g R + i. The sums over K
// are NA interleaved partial sums per row and thread, then the row's P lanes by xor shuffles, in a
// fixed order. Every operation of the recurrence is an explicit round-to-nearest intrinsic, so no
// compiler contraction changes the bits.
//
// Needs K, P, R, S_KIND (0 float32, 2 bfloat16 state) defined first; STREAM (1: streaming `.cs`
// state stores) defaults to 0.

#ifndef STREAM
#define STREAM 0
#endif
#ifndef SCATTER_SUMS
#define SCATTER_SUMS 0
#endif
#define SB (S_KIND == 0 ? 4 : 2)
#define EPC (16 / SB)
#define C (K / P)
#define NCH (C / EPC)
#define E (R * C)
#define NA (R >= 4 ? 1 : 4 / R)
#define KREG (R > 1)

typedef long long i64;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

template <int KIND> __device__ __forceinline__ float ldf(const void* p, i64 i) {
    if (KIND == 0) return ((const float*)p)[i];
    if (KIND == 1) return h2f(((const unsigned short*)p)[i]);
    return bf2f(((const unsigned short*)p)[i]);
}
template <int KIND> __device__ __forceinline__ void stf(void* p, i64 i, float f) {
    if (KIND == 0) ((float*)p)[i] = f;
    else if (KIND == 1) ((unsigned short*)p)[i] = f2h(f);
    else ((unsigned short*)p)[i] = f2bf(f);
}
// f rounded to the tensor kind's precision and back (what a store and a load give)
template <int KIND> __device__ __forceinline__ float roundf_kind(float f) {
    if (KIND == 0) return f;
    if (KIND == 1) return h2f(f2h(f));
    return bf2f(f2bf(f));
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

// One token's q and k, L2-normalised over K and q then times scale: the warp holds them as elements
// lane + 32 m (qv, kv), their norms nq, nk (sqrt(sum x^2 + 1e-6), as vLLM's kernels) come from the caller,
// which sums the squares as it loads them. The results go to the token's shared rows kn and qn, and k also to
// kside[krow + ...] where write_k. Returns k.q of the normalised pair (the warp's sum, in every lane).
// (With the sums and norms in here, NVVM emits the last square's FMA before the first warp_sum, not after it,
// and a kside + krow pointer argument changes the index arithmetic: other SASS, benchmarks/gdn_sass_digest.py.)
__device__ __forceinline__ float norm_qk(const float (&qv)[K / 32], const float (&kv)[K / 32], float nq, float nk,
                                         float scale, int lane, float* kn, float* qn, bool write_k, float* kside,
                                         i64 krow) {
    float kq = 0.f;
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
        const float kk = __fdiv_rn(kv[m], nk);
        const float qq = __fmul_rn(__fdiv_rn(qv[m], nq), scale);
        kn[lane + 32 * m] = kk;
        qn[lane + 32 * m] = qq;
        if (write_k) kside[krow + lane + 32 * m] = kk;
        kq = __fmaf_rn(kk, qq, kq);
    }
    return warp_sum(kq);
}

// The NA partial sums of one row of a thread, combined in a fixed tree.
__device__ __forceinline__ float local_sum(const float (&a)[NA]) {
    float s = a[0];
    if (NA == 2) s = __fadd_rn(a[0], a[1 % NA]);
    if (NA == 4) s = __fadd_rn(__fadd_rn(a[0], a[1 % NA]), __fadd_rn(a[2 % NA], a[3 % NA]));
    return s;
}

// The NA partial sums of one row (local_sum), then the row's P lanes (xor shuffles).
__device__ __forceinline__ float row_sum(const float (&a)[NA]) {
    float s = local_sum(a);
#pragma unroll
    for (int m = 1; m < P; m <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

#if SCATTER_SUMS
// (SCATTER_SUMS 1, step.cu's suffix `x`) The row sums of `pass` by a reduce-scatter over the row's P lanes instead
// of one xor butterfly per sum: NS values (the R sums of S k, then with q the R sums of S q), each a lane's NA
// partial sums combined as in row_sum (local_sum). At the step of lane mask m (1, 2, 4, ...) a lane keeps the half
// of its values that bit m of its lane selects (the upper half if set) and sends the other half to lane ^ m, adding
// what it receives; once one value is left, the remaining masks are row_sum's butterfly. Every value is added in
// row_sum's tree (at each node the same two operands, in the other order on the partner lane: __fadd_rn is
// commutative), so the sums are bitwise row_sum's, with NS/2 + NS/4 + ... shuffles in place of NS log2 P. Value j
// ends in lane sum_lane<NS>(j) (and in the lanes that differ from it in bits above log2 NS), as element j % Q of the
// thread's array (Q = NS / P values a lane when NS > P, else 1).
template <int NS> __device__ __forceinline__ void scatter_sums(float (&v)[NS], int p) {
#pragma unroll
    for (int m = 1; m < P; m <<= 1) {
        if (m < NS) {  // a halving step: the lane holds NS / m values and keeps half of them
            const int h = NS / m / 2;
            const bool up = (p & m) != 0;
#pragma unroll
            for (int j = 0; j < NS / 2; ++j)
                if (j < h) {
                    const float send = up ? v[j] : v[j + h];
                    const float keep = up ? v[j + h] : v[j];
                    v[j] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, m));
                }
        } else {  // one value left (NS <= m): row_sum's butterfly
            v[0] = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], m));
        }
    }
}
// the lane (of the row's P) holding value j of scatter_sums<NS>'s NS values: bit s of the lane, for each halving
// step s (mask 1 << s below P and NS), is whether j is in the upper half kept at that step
template <int NS> __device__ __forceinline__ constexpr int sum_lane(int j) {
    int l = 0, s = 0;
    for (int half = NS / 2; half >= 1 && (1 << s) < P; half /= 2, ++s)
        if (j & half) l |= 1 << s;
    return l;
}
#endif

// A token's outputs of the thread's R rows after pass<true>, rounded to the output dtype (kind OK), into orow[i]:
// written by lane 0 after row_sum's butterfly (every lane of the row has them), or with SCATTER_SUMS by the lane that
// holds row i's sum of S q (sum_lane), the only one whose o[i] is right (step.cu's and replay.cu's output rows).
template <int OK> __device__ __forceinline__ void store_outputs(float* orow, const float (&o)[R], int p) {
#if SCATTER_SUMS
#pragma unroll
    for (int i = 0; i < R; ++i)
        if (p == sum_lane<2 * R>(R + i)) orow[i] = roundf_kind<OK>(o[i]);
#else
    if (p == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i) orow[i] = roundf_kind<OK>(o[i]);
    }
#endif
}

// The thread's chunks of its R rows from/to memory (pool dtype), as float32 registers:
// S[i * C + j * EPC + e] = element (p + P j) EPC + e of row g R + i.
__device__ __forceinline__ void load_rows(float (&S)[E], const char* tilep, int g, int p) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const uint4* rowp = (const uint4*)(tilep + (i64)(g * R + i) * K * SB);
#pragma unroll
        for (int j = 0; j < NCH; ++j) {
            const uint4 r = rowp[p + P * j];
            float* d = S + i * C + j * EPC;
            if (S_KIND == 0) {
                d[0] = __uint_as_float(r.x);
                d[1] = __uint_as_float(r.y);
                d[2] = __uint_as_float(r.z);
                d[3] = __uint_as_float(r.w);
            } else {
                const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    d[2 * q] = __uint_as_float(w[q] << 16);
                    d[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
                }
            }
        }
    }
}
__device__ __forceinline__ void st16(uint4* p, uint4 r) {
#if STREAM
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)
                 : "memory");
#else
    *p = r;
#endif
}

__device__ __forceinline__ void store_rows(char* tilep, const float (&S)[E], int g, int p) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        uint4* rowp = (uint4*)(tilep + (i64)(g * R + i) * K * SB);
#pragma unroll
        for (int j = 0; j < NCH; ++j) {
            const float* d = S + i * C + j * EPC;
            uint4 r;
            if (S_KIND == 0) {
                r.x = __float_as_uint(d[0]);
                r.y = __float_as_uint(d[1]);
                r.z = __float_as_uint(d[2]);
                r.w = __float_as_uint(d[3]);
            } else {
                unsigned w[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) w[q] = (unsigned)f2bf(d[2 * q]) | ((unsigned)f2bf(d[2 * q + 1]) << 16);
                r.x = w[0]; r.y = w[1]; r.z = w[2]; r.w = w[3];
            }
            st16(rowp + p + P * j, r);
        }
    }
}

// A 16-byte shared-memory load that ptxas may not merge with an earlier one of the same address
// (with R = 1 it would keep the C values of k in registers between the dot and the update, and spill).
__device__ __forceinline__ void lds4(float* r, const float* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]) : "r"(a));
}

// One token of the delta rule on the thread's R rows:
//   hk = (S k) d;  u = (v - hk) beta;  [hq = (S q) d;  o = hq + u (k.q)];  S = S d + u k
// (the order of PK0003's and vLLM's kernels). NEW: also the outputs o[R] (q given). upd
// false: no state update (a step's last token: its state is never read; the next step
// replays it). The two sweeps over the thread's columns share their loop nest but stay written
// out: as one __forceinline__ helper (the per-column operation a lambda, or both operations in
// it) step.cu's 16x8x1t128m8c builds get other SASS (benchmarks/gdn_sass_digest.py).
template <bool NEW>
__device__ __forceinline__ void pass(float (&S)[E], const float* ks, const float* qs, const float (&v)[R], float d,
                                     float beta, float kq, int p, bool upd, float (&o)[R]) {
    float kk[KREG ? C : 4];
    float a[R][NA], b[R][NA];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int x = 0; x < NA; ++x) a[i][x] = b[i][x] = 0.f;
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
        const int c = (p + P * j) * EPC;
#pragma unroll
        for (int jj = 0; jj < EPC; jj += 4) {
            float* k4 = KREG ? kk + j * EPC + jj : kk;
            lds4(k4, ks + c + jj);
            float q4[4];
            if (NEW) lds4(q4, qs + c + jj);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = j * EPC + jj + e;
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    a[i][col % NA] = __fmaf_rn(S[i * C + col], k4[e], a[i][col % NA]);
                    if (NEW) b[i][col % NA] = __fmaf_rn(S[i * C + col], q4[e], b[i][col % NA]);
                }
            }
        }
    }
    float u[R];
#if SCATTER_SUMS
    {
        constexpr int NS = NEW ? 2 * R : R, Q = NS > P ? NS / P : 1;
        float sv[NS];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            sv[i] = local_sum(a[i]);
            if (NEW) sv[(R + i) % NS] = local_sum(b[i]);
        }
        scatter_sums<NS>(sv, p);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float hk = __fmul_rn(__shfl_sync(0xffffffffu, sv[i % Q], sum_lane<NS>(i), P), d);
            u[i] = __fmul_rn(__fsub_rn(v[i], hk), beta);
            // (right in lane sum_lane<NS>(R + i) only, which holds row i's sum of S q)
            if (NEW) o[i] = __fmaf_rn(u[i], kq, __fmul_rn(sv[(R + i) % Q], d));
        }
    }
#else
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float hk = __fmul_rn(row_sum(a[i]), d);
        u[i] = __fmul_rn(__fsub_rn(v[i], hk), beta);
        if (NEW) o[i] = __fmaf_rn(u[i], kq, __fmul_rn(row_sum(b[i]), d));
    }
#endif
    if (!upd) return;
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
        const int c = (p + P * j) * EPC;
#pragma unroll
        for (int jj = 0; jj < EPC; jj += 4) {
            float* k4 = KREG ? kk + j * EPC + jj : kk;
            if (!KREG) lds4(k4, ks + c + jj);  // again, not kept from the dot above (R = 1)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = j * EPC + jj + e;
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    float& s_ = S[i * C + col];
                    s_ = __fmaf_rn(u[i], k4[e], __fmul_rn(s_, d));
                }
            }
        }
    }
}
