// GDN replayed spec verify (sndr/kernels/gdn/replay.py, docs/gdn-replay.md): the CUDA kernel.
//
// One block per (request, value head); (V / R) * P threads. Thread (g, p) owns R rows of the
// [V, K] state tile (rows g R .. g R + R - 1) and, in each, the 16-byte chunks c = p, p + P,
// p + 2P, ... (C = K / P columns): R * C float32 values in registers. So the reductions over
// K (S k, S q) are thread-local sums plus log2(P) xor shuffles among the row's P lanes, and a
// warp's state load/store instruction covers whole P * 16-byte runs of 32 / P row groups.
// The step's per-token vectors (normalised k and q, v, decay, beta, k.q) are built once per
// block in shared memory before the passes. With R > 1 a thread keeps its C values of k in
// registers through a token's pass (the dot and the update) and uses each for its R rows: a
// shared-memory load feeds 2 R FMAs instead of 1, which is what bounds R = 1 (the load path
// returns 128 bytes per SM and cycle, a quarter of what the FMA pipes consume).
//
// Exactness: the replay of a token and the token's own pass in the step that first ran it
// are the same function (`pass` below) on the same float32 inputs (the side buffer keeps
// the normalised k, decay and beta in float32 and v as given), with every operation of the
// recurrence written as an explicit round-to-nearest intrinsic (__fmaf_rn, __fmul_rn, ...),
// so no compiler contraction can make them differ: the replayed state is bit for bit the
// state the step's outputs were computed from. The reduction order over K is fixed (NA
// interleaved partial sums per row and thread, then the row's lanes by xor shuffles; float
// addition is commutative, so every lane of a row gets the same bits).
//
// Macros: H, HV, K, V, P (lanes per state row), R (rows per thread), TM (side-buffer tokens),
// MINB (blocks per SM for the register allocator), PREFETCH (1: the tile to L2 as soon as its
// slot is known), SIGMOID_GATE, and per tensor a kind (0 float32, 1 float16, 2 bfloat16):
// X_KIND (mixed_qkv and the side buffer's v), AB_KIND (a, b), ALOG_KIND, DT_KIND, Z_KIND
// (output_gate), W_KIND (norm weight), O_KIND (out), S_KIND (state: 0 or 2). KSEL: compile only
// the kernel of one launch (0 step, 1 step_persistent, 2 step_copy, 3 materialize; undefined:
// all), at most a third of NVRTC's time. STEP_SMEM_MAX: the host's bound of StepSmem. SCATTER_SUMS (rows.cuh;
// GdnReplay's scatter_sums): each token's row sums by one reduce-scatter over the row's lanes, the same bits.

#ifndef R
#define R 1
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#define NT ((V / R) * P)
#define NWARPS (NT / 32)
#define MW (2 + TM)
#define Z_BYTES (Z_KIND == 0 ? 4 : 2)

#include "rows.cuh"

// copy one element's bits (the side buffer keeps v as given)
template <int KIND> __device__ __forceinline__ void cpy(void* dst, i64 j, const void* src, i64 i) {
    if (KIND == 0) ((float*)dst)[j] = ((const float*)src)[i];
    else ((unsigned short*)dst)[j] = ((const unsigned short*)src)[i];
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

// Shared memory of one tile of the step (static in gdn_replay_step and in the L2 persistent
// kernel; in the copy persistent kernel it follows the state buffer in dynamic memory).
struct StepSmem {
    __align__(16) ReplaySmem rs;
    __align__(16) float kn[TM][K];
    __align__(16) float qn[TM][K];
    __align__(16) float vn[TM][V];
    __align__(16) float on[TM][V];
    __align__(16) float sn[TM][4];  // decay, beta, k.q
    __align__(16) float rstd[TM];
    __align__(16) long long cp_base;  // the copy kernel: the slot whose tile the buffer receives (-1: none)
};
#ifdef STEP_SMEM_MAX
static_assert(sizeof(StepSmem) <= STEP_SMEM_MAX, "StepSmem outgrew the host's bound (replay.step_smem_bytes)");
#endif

// A tile's header, read from the step's small inputs: what to do and from which slot.
// run: 0 nothing (no tokens), 1 zero outputs, no state (padding, num_accepted outside [1, cols],
// no entry and no snapshot to read), 2 the step. Every thread of a block reads the same values.
struct TileHdr {
    i64 bos, s0, base;
    int ntok, ntok_all, acc, par, pending, run;
};
__device__ __forceinline__ TileHdr tile_hdr(int tile, const int* __restrict__ indices, const int* __restrict__ num_accepted,
                                            const int* __restrict__ cu_seqlens, const int* meta, int cols, i64 s_idx_seq) {
    TileHdr t;
    const int n = tile / HV, hv = tile % HV;
    t.bos = cu_seqlens[n];
    t.ntok_all = cu_seqlens[n + 1] - (int)t.bos;
    t.ntok = min(t.ntok_all, TM);  // the host contract: tokens per request == columns <= TM
    t.run = 0;
    t.par = t.pending = 0;
    t.s0 = t.base = 0;
    t.acc = 0;
    if (t.ntok_all <= 0) return t;
    const int* idxrow = indices + (i64)n * s_idx_seq;
    t.s0 = idxrow[0];
    t.acc = num_accepted[n];
    const bool ok = t.s0 > 0 && t.acc >= 1 && t.acc <= cols;
    i64 src = 0;
    if (ok) {
        const int* mrow = meta + (t.s0 * HV + hv) * MW;
        t.par = mrow[0];
        t.pending = mrow[1];
        if (t.pending <= 0) src = idxrow[t.acc - 1];
    }
    t.run = (!ok || (t.pending <= 0 && src <= 0)) ? 1 : 2;
    t.base = t.pending > 0 ? t.s0 : src;
    return t;
}

// cp.async.bulk (TMA) of a contiguous state tile into shared memory, completing an mbarrier
// (the pattern of turboquant_k8v4/decode_k8v4.cu).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void tile_copy(unsigned dst, const void* src, unsigned bar) {
    // the block's reads of the buffer (generic proxy, ordered before this by a barrier) before the copy's writes
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(V * K * SB) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(dst), "l"(src), "r"(V * K * SB), "r"(bar) : "memory");
}

// One (request, value head) tile of the step. MODE 0: gdn_replay_step (one tile per block).
// MODE 1: the persistent kernel with an L2 prefetch of the next tile `next` (-1: none) at the
// end of this tile's staging, so that its DRAM read overlaps this tile's passes. MODE 2:
// the persistent kernel with a shared-memory state buffer `buf`: this tile's state was copied
// there by TMA while the previous tile ran; once it is in registers the next tile's copy is
// issued, so the DRAM read of tile i + 1 overlaps the passes of tile i (the registers and the
// buffer are the two halves of the double buffer). The state values and every operation on
// them are the same in all modes: the same bits.
template <int MODE>
__device__ __forceinline__ void step_tile(StepSmem& sm, int tile, int next, const char* buf, unsigned& phase,
    const void* __restrict__ x, const void* __restrict__ a, const void* __restrict__ b, const void* __restrict__ A_log,
    const void* __restrict__ dt_bias, void* __restrict__ out, void* state, const int* __restrict__ indices,
    const int* __restrict__ num_accepted, const int* __restrict__ cu_seqlens, const void* __restrict__ z,
    const void* __restrict__ norm_w, float* side_k, void* side_v, float* side_gb, int* meta,
    float scale, float norm_eps, int cols, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok, i64 s_z_tok, i64 s_z_head,
    i64 s_state_slot, i64 s_idx_seq, i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot) {
    ReplaySmem& rs = sm.rs;
    float(&kn)[TM][K] = sm.kn;
    float(&qn)[TM][K] = sm.qn;
    float(&vn)[TM][V] = sm.vn;
    float(&on)[TM][V] = sm.on;
    float(&sn)[TM][4] = sm.sn;
    float(&rstd)[TM] = sm.rstd;

    const int tid = threadIdx.x, g = tid / P, p = tid % P, lane = tid & 31, warp = tid >> 5;
    const int n = tile / HV, hv = tile % HV, h = hv / (HV / H);
    const TileHdr th = tile_hdr(tile, indices, num_accepted, cu_seqlens, meta, cols, s_idx_seq);
    // the next tile's source (MODE 1, 2): its header now, its loads overlapping this tile's
    const char* nsrc = nullptr;
    i64 nbase = -1;
    if (MODE == 1 && next >= 0) {  // the next tile's column-0 slot (its base in steady state; a
        // first step's snapshot column is not worth the dependent loads: the prefetch is a hint)
        nbase = indices[(i64)(next / HV) * s_idx_seq];
        if (nbase > 0) nsrc = (const char*)state + (nbase * s_state_slot + (i64)(next % HV) * V * K) * SB;
    }
    if (MODE == 2 && next >= 0) {
        const TileHdr nh = tile_hdr(next, indices, num_accepted, cu_seqlens, meta, cols, s_idx_seq);
        if (nh.run == 2) {
            nbase = nh.base;
            nsrc = (const char*)state + (nbase * s_state_slot + (i64)(next % HV) * V * K) * SB;
        }
    }
    // MODE 2: the slot whose tile the buffer receives (published by thread 0 before a barrier)
    const i64 cp = MODE == 2 ? sm.cp_base : -1;
    const unsigned bar = MODE == 2 ? (unsigned)__cvta_generic_to_shared(buf) + V * K * SB : 0u;
    const i64 bos = th.bos;
    const int ntok = th.ntok;
    if (th.run != 2) {
        if (th.run == 1) {
            for (int i = tid; i < ntok * V; i += NT) stf<O_KIND>(out, ((bos + i / V) * HV + hv) * V + i % V, 0.f);
        }
        if (MODE == 2) {
            if (cp >= 0) {  // not under the host contract (a tile copied but not run): drain it
                mbar_wait(bar, phase);
                phase ^= 1u;
            }
            __syncthreads();  // every thread has read cp_base and is done with the buffer
            if (tid == 0) {
                if (nsrc) tile_copy((unsigned)__cvta_generic_to_shared(buf), nsrc, bar);
                sm.cp_base = nbase;
            }
            __syncthreads();
        }
        return;
    }
    const i64 s0 = th.s0, base_slot = th.base;
    const int par = th.par, pending = th.pending, acc = th.acc;
    int* mrow = meta + (s0 * HV + hv) * MW;
    const int* idxrow = indices + (i64)n * s_idx_seq;
#if PREFETCH
    // The tile to L2 now, while the staging below waits on its small dependent loads; the
    // register loads after the barrier then hit L2 (the kernel's time is otherwise the sum of
    // that latency, the DRAM read and the passes: two blocks per SM hide little of it). The
    // gate rows of the norm (read last) too. MODE 1: the previous tile prefetched this one
    // (prefetching the gate rows too costs it an 8-byte stack spill at 64 registers).
    if (MODE != 1) {
        if (MODE == 0) {  // MODE 1: the previous tile prefetched it; MODE 2: it is being copied
            const char* tb = (const char*)state + (base_slot * s_state_slot + (i64)hv * V * K) * SB;
            for (int off = tid * 128; off < V * K * SB; off += NT * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(tb + off));
        }
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
        const float kq = norm_qk(qv, kv, nq, nk, scale, lane, kn[t], qn[t], write_k, skw, (i64)t * H * K);
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
    if (MODE == 1 && nsrc) {  // the next tile's state to L2, read from DRAM while this one's passes run
        for (int off = tid * 128; off < V * K * SB; off += NT * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(nsrc + off));
    }
    __syncthreads();
    // the state after the staging: its 64 KiB of loads would otherwise hold E registers through it
    const i64 tile_off = (i64)hv * V * K;
    float S[E], vv[R], o[R];
    if (MODE == 2) {
        if (cp >= 0) {
            mbar_wait(bar, phase);
            phase ^= 1u;
        }
        // the buffer holds this tile's base under the host contract; else (a slot that changed
        // between the two reads of the header) the state from memory, as MODE 0 reads it
        if (cp == base_slot) load_rows(S, buf, g, p);
        else load_rows(S, (const char*)state + (base_slot * s_state_slot + tile_off) * SB, g, p);
        __syncthreads();  // the buffer is free: the next tile's state into it while this one's passes run
        if (tid == 0) {
            if (nsrc) tile_copy((unsigned)__cvta_generic_to_shared(buf), nsrc, bar);
            sm.cp_base = nbase;
        }
    } else {
        load_rows(S, (const char*)state + (base_slot * s_state_slot + tile_off) * SB, g, p);
    }

    for (int j = 0; j < n_rep; ++j) {
#pragma unroll
        for (int i = 0; i < R; ++i) vv[i] = rs.v[j][g * R + i];
        pass<false>(S, rs.k[j], nullptr, vv, rs.db[j][0], rs.db[j][1], 0.f, p, true, o);
    }
    if (S_KIND != 0 && n_rep > 0) {  // vLLM's snapshot of column acc - 1 is stored in the pool dtype
#pragma unroll
        for (int e = 0; e < E; ++e) S[e] = roundf_kind<S_KIND>(S[e]);
    }
    // the one state write of the step: the base of the next
    store_rows((char*)state + (s0 * s_state_slot + tile_off) * SB, S, g, p);

    for (int t = 0; t < ntok; ++t) {
#pragma unroll
        for (int i = 0; i < R; ++i) vv[i] = vn[t][g * R + i];
        pass<true>(S, kn[t], qn[t], vv, sn[t][0], sn[t][1], sn[t][2], p, t + 1 < ntok, o);
        store_outputs<O_KIND>(&on[t][g * R], o, p);  // (rounded before the norm)
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
    if (MODE != 0) __syncthreads();  // the shared buffers (and cp_base) are the next tile's
}

#define STEP_PARAMS                                                                                                   \
    const void* __restrict__ x, const void* __restrict__ a, const void* __restrict__ b, const void* __restrict__ A_log, \
        const void* __restrict__ dt_bias, void* __restrict__ out, void* state, const int* __restrict__ indices,      \
        const int* __restrict__ num_accepted, const int* __restrict__ cu_seqlens, const void* __restrict__ z,        \
        const void* __restrict__ norm_w, float* side_k, void* side_v, float* side_gb, int* meta, float scale,        \
        float norm_eps, int cols, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok, i64 s_z_tok, i64 s_z_head, i64 s_state_slot, \
        i64 s_idx_seq, i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot
#define STEP_ARGS                                                                                                   \
    x, a, b, A_log, dt_bias, out, state, indices, num_accepted, cu_seqlens, z, norm_w, side_k, side_v, side_gb, meta, \
        scale, norm_eps, cols, s_x_tok, s_a_tok, s_b_tok, s_z_tok, s_z_head, s_state_slot, s_idx_seq, s_sk_slot,     \
        s_sv_slot, s_sg_slot

#if !defined(KSEL) || KSEL == 0
extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_step(STEP_PARAMS) {
    __shared__ __align__(16) StepSmem sm;
    unsigned phase = 0;
    step_tile<0>(sm, blockIdx.x, -1, nullptr, phase, STEP_ARGS);
}
#endif

// The same step on a grid of (blocks per SM) x (SMs) blocks, each running tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... (n_tiles in all): with one tile per block a block's load and
// its passes follow each other and two blocks per SM hide little of either.
// gdn_replay_step_persistent: the next tile's state to L2 during this tile's passes.
#if !defined(KSEL) || KSEL == 1
extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_step_persistent(STEP_PARAMS, int n_tiles) {
    __shared__ __align__(16) StepSmem sm;
    unsigned phase = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x)
        step_tile<1>(sm, t, t + (int)gridDim.x < n_tiles ? t + (int)gridDim.x : -1, nullptr, phase, STEP_ARGS);
}
#endif

// gdn_replay_step_copy: the next tile's state into a shared-memory buffer by TMA during this
// tile's passes. Dynamic shared memory: the state buffer (V K SB bytes), its mbarrier (128
// bytes reserved), then StepSmem (launched with STATE_BUF_BYTES + 128 + STEP_SMEM_MAX).
#if !defined(KSEL) || KSEL == 2
extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_step_copy(STEP_PARAMS, int n_tiles) {
    extern __shared__ __align__(128) unsigned char dsm[];
    const char* buf = (const char*)dsm;
    StepSmem& sm = *reinterpret_cast<StepSmem*>(dsm + V * K * SB + 128);
    const unsigned bar = (unsigned)__cvta_generic_to_shared(dsm) + V * K * SB;
    unsigned phase = 0;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        i64 cp = -1;
        const int t0 = blockIdx.x;
        if (t0 < n_tiles) {
            const TileHdr h0 = tile_hdr(t0, indices, num_accepted, cu_seqlens, meta, cols, s_idx_seq);
            if (h0.run == 2) {
                tile_copy(bar - V * K * SB, (const char*)state + (h0.base * s_state_slot + (i64)(t0 % HV) * V * K) * SB, bar);
                cp = h0.base;
            }
        }
        sm.cp_base = cp;
    }
    __syncthreads();
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x)
        step_tile<2>(sm, t, t + (int)gridDim.x < n_tiles ? t + (int)gridDim.x : -1, buf, phase, STEP_ARGS);
}
#endif

// Per listed slot with a side entry: vLLM's snapshots of that step, each to its column slot
// (the same `pass` as the step, so the same bits as the state its outputs came from).
#if !defined(KSEL) || KSEL == 3
extern "C" __global__ void __launch_bounds__(NT, MINB) gdn_replay_materialize(
    void* state, const int* __restrict__ slots, const float* side_k, const void* side_v, const float* side_gb,
    const int* meta, i64 s_state_slot, i64 s_sk_slot, i64 s_sv_slot, i64 s_sg_slot) {
    __shared__ __align__(16) ReplaySmem rs;
    const int tid = threadIdx.x, g = tid / P, p = tid % P;
    const i64 s0 = slots[blockIdx.x / HV];
    const int hv = blockIdx.x % HV, h = hv / (HV / H);
    if (s0 <= 0) return;
    const int* mrow = meta + (s0 * HV + hv) * MW;
    const int par = mrow[0];
    const int pending = min(mrow[1], TM);
    if (pending <= 0) return;
    const i64 tile = (i64)hv * V * K;
    float S[E], vv[R], o[R];
    load_rows(S, (const char*)state + (s0 * s_state_slot + tile) * SB, g, p);
    stage_replay(rs, pending, s0, par, h, hv, side_k, side_v, side_gb, s_sk_slot, s_sv_slot, s_sg_slot);
    __syncthreads();
    for (int j = 0; j < pending; ++j) {
#pragma unroll
        for (int i = 0; i < R; ++i) vv[i] = rs.v[j][g * R + i];
        pass<false>(S, rs.k[j], nullptr, vv, rs.db[j][0], rs.db[j][1], 0.f, p, true, o);
        const i64 col = mrow[2 + j];
        if (col > 0) {
            float Rs[E];
#pragma unroll
            for (int e = 0; e < E; ++e) Rs[e] = roundf_kind<S_KIND>(S[e]);
            store_rows((char*)state + (col * s_state_slot + tile) * SB, Rs, g, p);
        }
    }
}
#endif
