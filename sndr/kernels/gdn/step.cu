// PK0003's fused GDN step as a CUDA kernel (NVRTC; launcher sndr/kernels/gdn/cuda_step.py).
//
// The same step as kernels.py::_gdn_step_kernel for vLLM's two default-path calls: the fused
// MTP op (SPEC 1: post-conv mixed_qkv, per request cu_seqlens, the initial state from index
// column num_accepted - 1, none unless 1 <= num_accepted <= cols, token t's state to column
// t) and the packed decode + gated RMSNorm (SPEC 0: one token per request, its state read
// from and written to its slot). Slots <= 0 are padding: zero outputs, no state traffic.
//
// Shape: the V rows of a (request, value head) belong to CL = V / BV CTAs of NT threads (a
// thread-block cluster when CL > 1; one CTA per head when BV = V). Thread (g, p) holds R rows
// x C = K / P columns of the state in registers (P lanes per row, 16-byte chunks p, p + P,
// ...; replay.cu's layout), so the sums over K are thread-local sums plus log2(P) shuffles.
// A CTA passes over its BV rows RP = (NT / P) R at a time (CH passes), loading the next
// pass's rows into registers before the current pass computes, and runs all the request's
// tokens on each pass, storing each token's snapshot rows as they are computed. It stages
// the head's inputs once, before the passes: q and k L2-normalised (a warp per token), decay,
// beta, k.q, its v rows, gates and norm weights, and the tokens' slots, for all TM tokens
// (tokens beyond TM, i.e. beyond the index columns, are outside the op's contract and not
// computed). In one-pass shapes (EARLY_QK) each warp's first token's q, k, a, b and slot are
// loaded before the v rows and gates, so that the staging costs one memory round trip after
// cu_seqlens, not two (ncu, bf16 batch 32 T = 2, before this: 3.0 of 13.5 cycles per issued
// instruction stalled at a barrier, waiting for the staging warps; 2% faster after it). The
// gated RMSNorm needs the sum of squares over the head's V outputs: each CTA keeps its rows'
// outputs (rounded to the output dtype, as vLLM rounds them before its norm) in shared memory,
// pushes its partial sums into every CTA of the cluster (DSMEM), and one cluster barrier later
// each CTA normalises and gates its own rows. (A barrier arrival at the start, waited for just
// before the push, guarantees every CTA of the cluster has started.) The shapes measured on
// the H200 per cell are in routing.CUDA_SHAPES (docs/bench-gdn-h200.md).
//
// Arithmetic: float32, the order of the Triton kernel (hk = (S k) d, hq = (S q) d,
// u = (v - hk) beta, o = hq + u (k.q), S = S d + u k), written with explicit round-to-
// nearest intrinsics so no contraction changes it; q and k / sqrt(sum x^2 + 1e-6); decay
// exp(-exp(A_log) softplus(a + dt_bias)) (softplus threshold 20), beta sigmoid(b).
//
// Macros: H, HV, K, V, BV (rows per CTA), P (lanes per row), R (rows per thread), NT (threads
// per CTA), TM (tokens staged: at least the index columns), MINB (CTAs per SM asked of the register allocator), SPEC, STREAM (1:
// streaming snapshot stores), SIGMOID_GATE, IDX64 / ACC64 / CU64 (int64 index tensors), and a
// kind per tensor (0 float32, 1 float16, 2 bfloat16): X_KIND (mixed_qkv), AB_KIND (a, b),
// ALOG_KIND, DT_KIND, Z_KIND (output gate), W_KIND (norm weight), O_KIND (out), S_KIND
// (state: 0 or 2); EARLY_QK (default: one pass, CH == 1) the early staging loads.

#ifndef STREAM
#define STREAM 0
#endif
#define CL (V / BV)
#define RP ((NT / P) * R)  // rows per pass
#define CH (BV / RP)       // passes over the CTA's rows
#define NWARPS (NT / 32)
#define SB (S_KIND == 0 ? 4 : 2)
#define EPC (16 / SB)
#define C (K / P)
#define NCH (C / EPC)
#define E (R * C)
#define NA (R >= 4 ? 1 : 4 / R)
#define KREG (R > 1)
// a warp's first token's q, k, a, b and slot loaded before the v rows and gates (below); not with several
// passes, whose shapes run at 64-80 registers and would spill the early values
#ifndef EARLY_QK
#define EARLY_QK (CH == 1)
#endif

#if CL > 1
#define CLUSTER_ATTR __cluster_dims__(CL, 1, 1)
#else
#define CLUSTER_ATTR
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
template <int KIND> __device__ __forceinline__ float roundf_kind(float f) {
    if (KIND == 0) return f;
    if (KIND == 1) return h2f(f2h(f));
    return bf2f(f2bf(f));
}
template <int WIDE> __device__ __forceinline__ i64 ldi(const void* p, i64 i) {
    return WIDE ? ((const i64*)p)[i] : (i64)((const int*)p)[i];
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

// The NA partial sums of one row (fixed tree), then the row's P lanes (xor shuffles).
__device__ __forceinline__ float row_sum(const float (&a)[NA]) {
    float s = a[0];
    if (NA == 2) s = __fadd_rn(a[0], a[1 % NA]);
    if (NA == 4) s = __fadd_rn(__fadd_rn(a[0], a[1 % NA]), __fadd_rn(a[2 % NA], a[3 % NA]));
#pragma unroll
    for (int m = 1; m < P; m <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
    return s;
}

// S[i * C + j * EPC + e] = element (p + P j) EPC + e of local row g R + i.
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

// A 16-byte shared-memory load ptxas may not merge with an earlier one of the same address
// (with R = 1 it would otherwise keep the C values of k live between the dot and the update).
__device__ __forceinline__ void lds4(float* r, const float* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r[0]), "=f"(r[1]), "=f"(r[2]), "=f"(r[3]) : "r"(a));
}

// One token on the thread's R rows: hk = (S k) d; u = (v - hk) beta; hq = (S q) d;
// o = hq + u (k.q); S = S d + u k.
__device__ __forceinline__ void pass(float (&S)[E], const float* ks, const float* qs, const float (&v)[R], float d,
                                     float beta, float kq, int p, float (&o)[R]) {
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
            lds4(q4, qs + c + jj);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = j * EPC + jj + e;
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    a[i][col % NA] = __fmaf_rn(S[i * C + col], k4[e], a[i][col % NA]);
                    b[i][col % NA] = __fmaf_rn(S[i * C + col], q4[e], b[i][col % NA]);
                }
            }
        }
    }
    float u[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float hk = __fmul_rn(row_sum(a[i]), d);
        u[i] = __fmul_rn(__fsub_rn(v[i], hk), beta);
        o[i] = __fmaf_rn(u[i], kq, __fmul_rn(row_sum(b[i]), d));
    }
#pragma unroll
    for (int j = 0; j < NCH; ++j) {
        const int c = (p + P * j) * EPC;
#pragma unroll
        for (int jj = 0; jj < EPC; jj += 4) {
            float* k4 = KREG ? kk + j * EPC + jj : kk;
            if (!KREG) lds4(k4, ks + c + jj);
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

// Token t's staged inputs, loaded by one warp (lane: its K / 32 elements of q and k; a, b and the slot in
// every lane): q and k of key head h, a and b of value head hv, and (SPEC, lane 0) index column t of request n.
__device__ __forceinline__ void load_token(const void* x, const void* a, const void* b, const void* indices, i64 bos, int t,
                                           int n, int h, int hv, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok, i64 s_idx_seq,
                                           i64 s_idx_tok, int lane, float (&qv)[K / 32], float (&kv)[K / 32],
                                           float& a_t, float& b_t, i64& sl) {
    const i64 tok = bos + t;
    const i64 xr = tok * s_x_tok;
    a_t = ldf<AB_KIND>(a, tok * s_a_tok + hv);
    b_t = ldf<AB_KIND>(b, tok * s_b_tok + hv);
#pragma unroll
    for (int m = 0; m < K / 32; ++m) {
        qv[m] = ldf<X_KIND>(x, xr + h * K + lane + 32 * m);
        kv[m] = ldf<X_KIND>(x, xr + H * K + h * K + lane + 32 * m);
    }
#if SPEC
    sl = lane == 0 ? ldi<IDX64>(indices, (i64)n * s_idx_seq + (i64)t * s_idx_tok) : 0;
#endif
}

// cluster barrier halves (sm_90): arrive (relaxed or release) and wait (acquire)
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if CL > 1
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if CL > 1
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if CL > 1
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// store f to the same shared variable (at generic address p in this CTA) of cluster CTA `rank`
__device__ __forceinline__ void st_cluster(float* p, int rank, float f) {
#if CL > 1
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    unsigned ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(f) : "memory");
#else
    *p = f;
#endif
}

extern "C" __global__ void CLUSTER_ATTR __launch_bounds__(NT, MINB) gdn_fused_step(
    const void* __restrict__ x, const void* __restrict__ a, const void* __restrict__ b, const void* __restrict__ A_log,
    const void* __restrict__ dt_bias, void* __restrict__ out, void* state, const void* __restrict__ indices,
    const void* __restrict__ num_accepted, const void* __restrict__ cu_seqlens, const void* __restrict__ z,
    const void* __restrict__ norm_w, float scale, float norm_eps, int cols, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok,
    i64 s_o_tok, i64 s_z_tok, i64 s_z_head, i64 s_state_slot, i64 s_idx_seq, i64 s_idx_tok) {
    __shared__ __align__(16) float kn[TM][K];
    __shared__ __align__(16) float qn[TM][K];
    __shared__ float vn[TM][BV];
    __shared__ float gz[TM][BV];  // the gate act(z) of this CTA's rows
    __shared__ float wn[BV];      // the norm weight of this CTA's rows
    __shared__ float on[TM][BV];  // this CTA's rows of the outputs, rounded to the output dtype
    __shared__ float sn[TM][3];   // decay, beta, k.q
    __shared__ float parts[TM][CL];  // the sums of squares of every CTA of the head (each pushes its own)
    __shared__ float rstd[TM];
    __shared__ i64 slots[TM];

    const int tid = threadIdx.x, g = tid / P, p = tid % P, lane = tid & 31, warp = tid >> 5;
    const int rank = blockIdx.x % CL;
    const int nh = blockIdx.x / CL;
    const int n = nh / HV, hv = nh % HV, h = hv / (HV / H);
    const int row0 = rank * BV;
#if SPEC
    const i64 bos = ldi<CU64>(cu_seqlens, n);
    const int ntok = (int)(ldi<CU64>(cu_seqlens, n + 1) - bos);
    const i64 acc = ldi<ACC64>(num_accepted, n);
    const i64 slot0 = (acc >= 1 && acc <= cols) ? ldi<IDX64>(indices, (i64)n * s_idx_seq + (acc - 1) * s_idx_tok) : 0;
#else
    const i64 bos = n;
    const int ntok = 1;
    const i64 slot0 = ldi<IDX64>(indices, (i64)n * s_idx_seq);
#endif
    // (every CTA of a cluster is the same request and head: they all take the same branch here)
    if (ntok <= 0) return;
    if (slot0 <= 0) {  // padding: zero outputs, no state
        for (int i = tid; i < ntok * BV; i += NT)
            stf<O_KIND>(out, (bos + i / BV) * s_o_tok + (i64)hv * V + row0 + i % BV, 0.f);
        return;
    }
    const i64 tile = (i64)hv * V * K + (i64)row0 * K;
    const int nt = min(ntok, TM);  // (tokens beyond the index columns are outside the op's contract)
    float S[E], Sn[E], vv[R], o[R];
    load_rows(S, (const char*)state + (slot0 * s_state_slot + tile) * SB, g, p);  // the first pass's rows
    cluster_arrive_relaxed();  // this CTA has started (waited for before the first DSMEM store)
    const float neg_A = -expf(ldf<ALOG_KIND>(A_log, hv));
    const float dtb = ldf<DT_KIND>(dt_bias, hv);

    // the step's inputs: a warp per token for q and k (L2 norm), decay, beta, k.q, the token's slot; the CTA's
    // v rows, gates and norm weights. With EARLY_QK a warp's first token's q, k, a, b and slot are loaded before
    // the v rows and gates, so that all of them are in flight at once (one memory round trip after cu_seqlens,
    // not two).
    float qv[K / 32], kv[K / 32], a_t = 0.f, b_t = 0.f;
    i64 sl = 0;
    if (EARLY_QK && warp < nt) load_token(x, a, b, indices, bos, warp, n, h, hv, s_x_tok, s_a_tok, s_b_tok, s_idx_seq, s_idx_tok,
                              lane, qv, kv, a_t, b_t, sl);
    // (a lambda: with EARLY_QK it runs while the early loads are in flight, else after the token loop)
    auto stage_rows = [&]() {
        for (int i = tid; i < nt * BV; i += NT) {
            const i64 tok = bos + i / BV;
            const int r = row0 + i % BV;
            vn[i / BV][i % BV] = ldf<X_KIND>(x, tok * s_x_tok + 2 * H * K + (i64)hv * V + r);
            const float zz = ldf<Z_KIND>(z, tok * s_z_tok + (i64)hv * s_z_head + r);
            const float sg = 1.f / (1.f + expf(-zz));
            gz[i / BV][i % BV] = SIGMOID_GATE ? sg : zz * sg;
        }
        for (int r = tid; r < BV; r += NT) wn[r] = ldf<W_KIND>(norm_w, row0 + r);
    };
    if (EARLY_QK) stage_rows();
    for (int t = warp; t < nt; t += NWARPS) {
        if (!EARLY_QK || t != warp)
            load_token(x, a, b, indices, bos, t, n, h, hv, s_x_tok, s_a_tok, s_b_tok, s_idx_seq, s_idx_tok, lane, qv,
                       kv, a_t, b_t, sl);
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int m = 0; m < K / 32; ++m) {
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
            kq = __fmaf_rn(kk, qq, kq);
        }
        kq = warp_sum(kq);
        if (lane == 0) {
            const float xx = __fadd_rn(a_t, dtb);
            const float sp = xx <= 20.f ? logf(1.f + expf(xx)) : xx;
            sn[t][0] = expf(neg_A * sp);
            sn[t][1] = 1.f / (1.f + expf(-b_t));
            sn[t][2] = kq;
#if SPEC
            slots[t] = sl;
#else
            slots[t] = slot0;
#endif
        }
    }
    if (!EARLY_QK) stage_rows();
    __syncthreads();

    // CH passes over the CTA's rows, RP rows each: the next pass's rows are loaded before this one computes
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const i64 off = (i64)c * RP * K * SB;
        if (c + 1 < CH) load_rows(Sn, (const char*)state + (slot0 * s_state_slot + tile) * SB + off + RP * K * SB, g, p);
        for (int t = 0; t < nt; ++t) {
#pragma unroll
            for (int i = 0; i < R; ++i) vv[i] = vn[t][c * RP + g * R + i];
            pass(S, kn[t], qn[t], vv, sn[t][0], sn[t][1], sn[t][2], p, o);
            if (p == 0) {
#pragma unroll
                for (int i = 0; i < R; ++i) on[t][c * RP + g * R + i] = roundf_kind<O_KIND>(o[i]);
            }
            const i64 st = slots[t];
            if (st > 0) store_rows((char*)state + (st * s_state_slot + tile) * SB + off, S, g, p);
        }
        if (c + 1 < CH) {
#pragma unroll
            for (int e = 0; e < E; ++e) S[e] = Sn[e];
        }
    }
    __syncthreads();
    cluster_wait();  // (CL > 1) every CTA of the cluster has started
    // this CTA's sums of squares, pushed into every CTA of the head
    for (int t = warp; t < nt; t += NWARPS) {
        float ss = 0.f;
        for (int r = lane; r < BV; r += 32) ss = __fmaf_rn(on[t][r], on[t][r], ss);
        ss = warp_sum(ss);
        if (lane < CL) st_cluster(&parts[t][rank], lane, ss);
    }
#if CL > 1
    cluster_arrive_release();
    cluster_wait();
#else
    __syncthreads();
#endif
    if (tid < nt) {
        float s = parts[tid][0];
#pragma unroll
        for (int c = 1; c < CL; ++c) s = __fadd_rn(s, parts[tid][c]);
        rstd[tid] = 1.f / sqrtf(s / V + norm_eps);
    }
    __syncthreads();
    for (int i = tid; i < nt * BV; i += NT) {
        const int t = i / BV, r = i % BV;
        const float y = on[t][r] * rstd[t] * wn[r] * gz[t][r];
        stf<O_KIND>(out, (bos + t) * s_o_tok + (i64)hv * V + row0 + r, y);
    }
}
