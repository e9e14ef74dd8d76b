// GDN replayed spec verify (sndr/kernels/gdn/replay.py, docs/gdn-replay.md): the CUDA kernel.
//
// One block per (request, value head); V * P threads; thread (row, p) owns state row `row` of
// the [V, K] tile, 16-byte chunks c = p, p + P, p + 2P, ... of it (K / P elements in registers).
// So the reductions over K (S k, S q) are thread-local sums plus log2(P) shuffles inside the
// row's P lanes, and a warp's state load/store instruction covers 32 / P rows x P * 16
// contiguous bytes (whole 32-byte sectors). The step's per-token vectors (normalised k and
// q, v, decay, beta, k.q) are built once per block in shared memory before the passes.
//
// Exactness: the replay of a token and the token's own pass in the step that first ran it
// are the same function (`pass` below) on the same float32 inputs (the side buffer keeps
// the normalised k, decay and beta in float32 and v as given), with every operation of the
// recurrence written as an explicit round-to-nearest intrinsic (__fmaf_rn, __fmul_rn, ...),
// so no compiler contraction can make them differ: the replayed state is bit for bit the
// state the step's outputs were computed from. The reduction order over K is fixed (four
// interleaved partial sums per thread, then the row's lanes by xor shuffles; float addition
// is commutative, so every lane of a row gets the same bits).
//
// Macros: H, HV, K, V, P (threads per state row), TM (side-buffer tokens), MINB (blocks per
// SM for the register allocator), PREFETCH (1: the tile to L2 as soon as its slot is known),
// SIGMOID_GATE, and per tensor a kind (0 float32, 1 float16,
// 2 bfloat16): X_KIND (mixed_qkv and the side buffer's v), AB_KIND (a, b), ALOG_KIND,
// DT_KIND, Z_KIND (output_gate), W_KIND (norm weight), O_KIND (out), S_KIND (state: 0 or 2).

#define NT (V * P)
#define NWARPS (NT / 32)
#define SB (S_KIND == 0 ? 4 : 2)
#define EPC (16 / SB)
#define NCH (K / (EPC * P))
#define E (NCH * EPC)
#define MW (2 + TM)
#define Z_BYTES (Z_KIND == 0 ? 4 : 2)
#ifndef PREFETCH
#define PREFETCH 1
#endif

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
// copy one element's bits (the side buffer keeps v as given)
template <int KIND> __device__ __forceinline__ void cpy(void* dst, i64 j, const void* src, i64 i) {
    if (KIND == 0) ((float*)dst)[j] = ((const float*)src)[i];
    else ((unsigned short*)dst)[j] = ((const unsigned short*)src)[i];
}

__device__ __forceinline__ float row_sum(float a0, float a1, float a2, float a3) {
    float s = __fadd_rn(__fadd_rn(a0, a1), __fadd_rn(a2, a3));
#pragma unroll
    for (int m = 1; m < P; m <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

// The state row's chunks from/to memory (pool dtype), as float32 registers.
__device__ __forceinline__ void load_row(float (&S)[E], const void* rowp, int p) {
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
        const uint4 r = ((const uint4*)rowp)[p + P * i];
        if (S_KIND == 0) {
            S[i * EPC + 0] = __uint_as_float(r.x);
            S[i * EPC + 1] = __uint_as_float(r.y);
            S[i * EPC + 2] = __uint_as_float(r.z);
            S[i * EPC + 3] = __uint_as_float(r.w);
        } else {
            const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                S[i * EPC + 2 * j] = __uint_as_float(w[j] << 16);
                S[i * EPC + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        }
    }
}
__device__ __forceinline__ void store_row(void* rowp, const float (&S)[E], int p) {
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
        uint4 r;
        if (S_KIND == 0) {
            r.x = __float_as_uint(S[i * EPC + 0]);
            r.y = __float_as_uint(S[i * EPC + 1]);
            r.z = __float_as_uint(S[i * EPC + 2]);
            r.w = __float_as_uint(S[i * EPC + 3]);
        } else {
            unsigned w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                w[j] = (unsigned)f2bf(S[i * EPC + 2 * j]) | ((unsigned)f2bf(S[i * EPC + 2 * j + 1]) << 16);
            r.x = w[0]; r.y = w[1]; r.z = w[2]; r.w = w[3];
        }
        ((uint4*)rowp)[p + P * i] = r;
    }
}

// A 16-byte shared-memory load that ptxas may not merge with an earlier one of the same address
// (it would keep the E values of k in registers between the dot and the update, and spill).
__device__ __forceinline__ void lds4(float (&r)[4], const float* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]) : "r"(a));
}

// One token of the delta rule on the thread's part of a state row:
//   hk = (S k) d;  u = (v - hk) beta;  [hq = (S q) d;  o = hq + u (k.q)];  S = S d + u k
// (the order of PK0003's and vLLM's kernels). NEW: also the output (q given). upd false: no
// state update (a step's last token: its state is never read; the next step replays it).
template <bool NEW>
__device__ __forceinline__ float pass(float (&S)[E], const float* ks, const float* qs, float v, float d, float beta,
                                      float kq, int p, bool upd = true) {
    float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
        const int c = (p + P * i) * EPC;
#pragma unroll
        for (int j = 0; j < EPC; j += 4) {
            float kk[4];
            lds4(kk, ks + c + j);
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = __fmaf_rn(S[i * EPC + j + e], kk[e], a[e]);
            if (NEW) {
                float qq[4];
                lds4(qq, qs + c + j);
#pragma unroll
                for (int e = 0; e < 4; ++e) b[e] = __fmaf_rn(S[i * EPC + j + e], qq[e], b[e]);
            }
        }
    }
    const float hk = __fmul_rn(row_sum(a[0], a[1], a[2], a[3]), d);
    const float u = __fmul_rn(__fsub_rn(v, hk), beta);
    float o = 0.f;
    if (NEW) {
        const float hq = __fmul_rn(row_sum(b[0], b[1], b[2], b[3]), d);
        o = __fmaf_rn(u, kq, hq);
    }
    if (!upd) return o;
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
        const int c = (p + P * i) * EPC;
#pragma unroll
        for (int j = 0; j < EPC; j += 4) {
            float kk[4];
            lds4(kk, ks + c + j);  // again, not kept from the dot above: E more live registers
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float& s = S[i * EPC + j + e];
                s = __fmaf_rn(u, kk[e], __fmul_rn(s, d));
            }
        }
    }
    return o;
}

struct ReplaySmem {
    float k[TM][K];
    float v[TM][V];
    float db[TM][2];
};

// The pending tokens' inputs of half `par` of slot s0's side entry, for value head hv.
__device__ __forceinline__ void stage_replay(ReplaySmem& sm, int n_rep, i64 s0, int par, int h, int hv,
                                             const float* side_k, const void* side_v, const float* side_gb,
                                             i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot) {
    const int tid = threadIdx.x;
    const float* skr = side_k + s0 * s_sk_slot + ((i64)par * TM * H + h) * K;
    const i64 svr = s0 * s_sv_slot + ((i64)par * TM * HV + hv) * V;
    const float* sgr = side_gb + s0 * s_sg_slot + ((i64)par * TM * HV + hv) * 2;
    for (int i = tid; i < n_rep * K; i += NT) sm.k[i / K][i % K] = skr[(i64)(i / K) * H * K + i % K];
    for (int i = tid; i < n_rep * V; i += NT) sm.v[i / V][i % V] = ldf<X_KIND>(side_v, svr + (i64)(i / V) * HV * V + i % V);
    if (tid < n_rep) {
        sm.db[tid][0] = sgr[(i64)tid * HV * 2];
        sm.db[tid][1] = sgr[(i64)tid * HV * 2 + 1];
    }
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_step(
    const void* __restrict__ x, const void* __restrict__ a, const void* __restrict__ b, const void* __restrict__ A_log,
    const void* __restrict__ dt_bias, void* __restrict__ out, void* state, const int* __restrict__ indices,
    const int* __restrict__ num_accepted, const int* __restrict__ cu_seqlens, const void* __restrict__ z,
    const void* __restrict__ norm_w, float* side_k, void* side_v, float* side_gb, int* meta,
    float scale, float norm_eps, int cols, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok, i64 s_z_tok, i64 s_z_head,
    i64 s_state_slot, i64 s_idx_seq, i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot) {
    __shared__ __align__(16) ReplaySmem rs;
    __shared__ __align__(16) float kn[TM][K];
    __shared__ __align__(16) float qn[TM][K];
    __shared__ float vn[TM][V];
    __shared__ float on[TM][V];
    __shared__ float sn[TM][3];  // decay, beta, k.q
    __shared__ float rstd[TM];

    const int tid = threadIdx.x, row = tid / P, p = tid % P, lane = tid & 31, warp = tid >> 5;
    const int n = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H);
    const i64 bos = cu_seqlens[n];
    int ntok = cu_seqlens[n + 1] - (int)bos;
    if (ntok <= 0) return;
    ntok = min(ntok, TM);  // the host contract: tokens per request == columns <= TM
    const int* idxrow = indices + (i64)n * s_idx_seq;
    const i64 s0 = idxrow[0];
    const int acc = num_accepted[n];
    const bool ok = s0 > 0 && acc >= 1 && acc <= cols;
    int* mrow = meta + (s0 * HV + hv) * MW;
    int par = 0, pending = 0;
    i64 src = 0;
    if (ok) {
        par = mrow[0];
        pending = mrow[1];
        if (pending <= 0) src = idxrow[acc - 1];
    }
    // padding, or num_accepted outside [1, cols] (vLLM's CUDA op then reads and writes no
    // state), or no entry and no snapshot to read: zero outputs, as PK0003's step
    if (!ok || (pending <= 0 && src <= 0)) {
        for (int i = tid; i < ntok * V; i += NT) stf<O_KIND>(out, ((bos + i / V) * HV + hv) * V + i % V, 0.f);
        return;
    }
    const i64 base_slot = pending > 0 ? s0 : src;
#if PREFETCH
    // The tile to L2 now, while the staging below waits on its small dependent loads; the
    // register loads after the barrier then hit L2 (the kernel's time is otherwise the sum of
    // that latency, the DRAM read and the passes: two blocks per SM hide little of it). The
    // gate rows of the norm (read last) too.
    {
        const char* tb = (const char*)state + (base_slot * s_state_slot + (i64)hv * V * K) * SB;
        for (int off = tid * 128; off < V * K * SB; off += NT * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(tb + off));
        const int zl = (V * Z_BYTES + 127) / 128;
        if (tid < ntok * zl) {
            const char* zr = (const char*)z + ((bos + tid / zl) * s_z_tok + hv * s_z_head) * Z_BYTES + (tid % zl) * 128;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(zr));
        }
    }
#endif
    const int n_rep = pending > 0 ? min(acc, min(pending, TM)) : 0;
    stage_replay(rs, n_rep, s0, par, h, hv, side_k, side_v, side_gb, s_sk_slot, s_sv_slot, s_sg_slot);
    // this step's tokens: normalised q, k (a warp per token), v, decay, beta, k.q; and their
    // inputs to the side entry's other half, for the next step's replay
    const int wpar = 1 - par;
    const bool write_k = hv % (HV / H) == 0;
    float* skw = side_k + s0 * s_sk_slot + ((i64)wpar * TM * H + h) * K;
    const i64 svw = s0 * s_sv_slot + ((i64)wpar * TM * HV + hv) * V;
    float* sgw = side_gb + s0 * s_sg_slot + ((i64)wpar * TM * HV + hv) * 2;
    for (int t = warp; t < ntok; t += NWARPS) {
        const i64 xr = (bos + t) * s_x_tok;
        // the gate inputs first: their loads then overlap q's and k's
        const float a_t = ldf<AB_KIND>(a, (bos + t) * s_a_tok + hv), b_t = ldf<AB_KIND>(b, (bos + t) * s_b_tok + hv);
        float qv[K / 32], kv[K / 32];
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int m = 0; m < K / 32; ++m) {
            qv[m] = ldf<X_KIND>(x, xr + h * K + lane + 32 * m);
            kv[m] = ldf<X_KIND>(x, xr + H * K + h * K + lane + 32 * m);
            sq = __fmaf_rn(qv[m], qv[m], sq);
            sk = __fmaf_rn(kv[m], kv[m], sk);
        }
        const float nq = sqrtf(__fadd_rn(warp_sum(sq), 1e-6f)), nk = sqrtf(__fadd_rn(warp_sum(sk), 1e-6f));
        float kq = 0.f;
#pragma unroll
        for (int m = 0; m < K / 32; ++m) {
            const float kk = __fdiv_rn(kv[m], nk);
            const float qq = __fmul_rn(__fdiv_rn(qv[m], nq), scale);
            kn[t][lane + 32 * m] = kk;
            qn[t][lane + 32 * m] = qq;
            if (write_k) skw[(i64)t * H * K + lane + 32 * m] = kk;
            kq = __fmaf_rn(kk, qq, kq);
        }
        kq = warp_sum(kq);
        if (lane == 0) {
            const float neg_A = -expf(ldf<ALOG_KIND>(A_log, hv));
            const float xx = __fadd_rn(a_t, ldf<DT_KIND>(dt_bias, hv));
            const float sp = xx <= 20.f ? logf(1.f + expf(xx)) : xx;
            const float decay = expf(neg_A * sp);
            const float beta = 1.f / (1.f + expf(-b_t));
            sn[t][0] = decay;
            sn[t][1] = beta;
            sn[t][2] = kq;
            sgw[(i64)t * HV * 2] = decay;
            sgw[(i64)t * HV * 2 + 1] = beta;
        }
    }
    for (int i = tid; i < ntok * V; i += NT) {
        const i64 xi = (bos + i / V) * s_x_tok + 2 * H * K + hv * V + i % V;
        vn[i / V][i % V] = ldf<X_KIND>(x, xi);
        cpy<X_KIND>(side_v, svw + (i64)(i / V) * HV * V + i % V, x, xi);
    }
    __syncthreads();
    // the state after the staging: its 64 KiB of loads would otherwise hold E registers through it
    const i64 tile = (i64)hv * V * K + (i64)row * K;
    float S[E];
    load_row(S, (const char*)state + (base_slot * s_state_slot + tile) * SB, p);

    for (int j = 0; j < n_rep; ++j) pass<false>(S, rs.k[j], nullptr, rs.v[j][row], rs.db[j][0], rs.db[j][1], 0.f, p);
    if (S_KIND != 0 && n_rep > 0) {  // vLLM's snapshot of column acc - 1 is stored in the pool dtype
#pragma unroll
        for (int e = 0; e < E; ++e) S[e] = roundf_kind<S_KIND>(S[e]);
    }
    // the one state write of the step: the base of the next
    store_row((char*)state + (s0 * s_state_slot + tile) * SB, S, p);

    for (int t = 0; t < ntok; ++t) {
        const float o = pass<true>(S, kn[t], qn[t], vn[t][row], sn[t][0], sn[t][1], sn[t][2], p, t + 1 < ntok);
        if (p == 0) on[t][row] = roundf_kind<O_KIND>(o);  // the output is rounded before the norm
    }
    __syncthreads();
    // the gated RMSNorm over V of each token's output
    for (int t = warp; t < ntok; t += NWARPS) {
        float ss = 0.f;
        for (int v = lane; v < V; v += 32) ss = __fmaf_rn(on[t][v], on[t][v], ss);
        ss = warp_sum(ss);
        if (lane == 0) rstd[t] = 1.f / sqrtf(ss / V + norm_eps);
    }
    __syncthreads();
    for (int i = tid; i < ntok * V; i += NT) {
        const int t = i / V, v = i % V;
        const float zz = ldf<Z_KIND>(z, (bos + t) * s_z_tok + hv * s_z_head + v);
        const float sg = 1.f / (1.f + expf(-zz));
        const float gate = SIGMOID_GATE ? sg : zz * sg;
        const float y = on[t][v] * rstd[t] * ldf<W_KIND>(norm_w, v) * gate;
        stf<O_KIND>(out, ((bos + t) * HV + hv) * V + v, y);
    }
    if (tid == 0) {
#pragma unroll
        for (int c = 0; c < TM; ++c) mrow[2 + c] = c < cols ? idxrow[c] : 0;
        mrow[1] = cu_seqlens[n + 1] - (int)bos;
        mrow[0] = wpar;
    }
}

// Per listed slot with a side entry: vLLM's snapshots of that step, each to its column slot
// (the same `pass` as the step, so the same bits as the state its outputs came from).
extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_materialize(
    void* state, const int* __restrict__ slots, const float* side_k, const void* side_v, const float* side_gb,
    const int* meta, i64 s_state_slot, i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot) {
    __shared__ __align__(16) ReplaySmem rs;
    const int tid = threadIdx.x, row = tid / P, p = tid % P;
    const i64 s0 = slots[blockIdx.x / HV];
    const int hv = blockIdx.x % HV, h = hv / (HV / H);
    if (s0 <= 0) return;
    const int* mrow = meta + (s0 * HV + hv) * MW;
    const int par = mrow[0];
    const int pending = min(mrow[1], TM);
    if (pending <= 0) return;
    const i64 tile = (i64)hv * V * K + (i64)row * K;
    float S[E];
    load_row(S, (const char*)state + (s0 * s_state_slot + tile) * SB, p);
    stage_replay(rs, pending, s0, par, h, hv, side_k, side_v, side_gb, s_sk_slot, s_sv_slot, s_sg_slot);
    __syncthreads();
    for (int j = 0; j < pending; ++j) {
        pass<false>(S, rs.k[j], nullptr, rs.v[j][row], rs.db[j][0], rs.db[j][1], 0.f, p);
        const i64 col = mrow[2 + j];
        if (col > 0) {
            float R[E];
#pragma unroll
            for (int e = 0; e < E; ++e) R[e] = roundf_kind<S_KIND>(S[e]);
            store_row((char*)state + (col * s_state_slot + tile) * SB, R, p);
        }
    }
}
