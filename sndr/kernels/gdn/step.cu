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
// (state: 0 or 2); EARLY_QK (default: one pass, CH == 1) the early staging loads; TILE_SMEM (below).
//
// SHORT_CHAIN 1 (launch shape label suffix `c`; register tile, one pass, CH == 1): a shorter dependent-load chain
// per CTA. Every lane of every warp loads cu_seqlens[n], cu_seqlens[n + 1], num_accepted[n] and index column
// `lane` of request n at once (cols <= MAX_TM <= 32), and the initial slot is index column num_accepted - 1
// taken from its lane by a shuffle: the state rows' addresses are known one memory round trip after the launch,
// not two; the tokens' slots come from the same registers (no load per token). A_log and dt_bias are loaded
// before the chain, and all the staged inputs (the warp's first token's q, k, a, b; every v row, gate and norm
// weight of the CTA, in registers) are loaded before the state rows, so that they are not queued behind them
// and the staging costs one round trip, not one per NT staged values. The same float32 operations on the
// same values: outputs and states are bitwise those of the shape without `c`. With TILE_SMEM (suffix `cb`, any
// number of passes) only the prologue changes: every lane resolves the item as above and thread 0 starts the
// tile's copy one round trip earlier than TILE_SMEM's own chain (thread 0 alone: cu_seqlens and num_accepted,
// then the index column); the staging is TILE_SMEM's, the tokens' slots from the lanes' index columns.
//
// NORM_ASYNC 1 (launch shape label suffix `a`; clusters only, CL > 1): the norm's partial sums go to the cluster's
// CTAs by st.async, each completing the receiving CTA's mbarrier (expecting CL x nt sums), which the CTA waits for,
// instead of plain DSMEM stores and a cluster barrier with release semantics: that release waits until every
// earlier store of the thread, the snapshot rows included, has been performed (ncu, fp32 batch 8 T = 2
// `64x8x4t128m4c`: 9% of the warps' stall samples at its ERRBAR), so the norm and the output stores no longer
// wait for the state stores to drain. The same values in the same order: bitwise the shape without `a`.
//
// GUESS_ROWS 1 (suffix `g`; the short chain's prologue of the MTP call): warp 0 first sends to L2 the token rows
// (q, k, v, gate) the request would have if every request had `cols` tokens (vLLM's pure spec-verify batches), so
// that the staging loads, issued once cu_seqlens is known, find them in L2. A hint: the same loads and values.
//
// SCATTER_SUMS 1 (suffix `x`; rows.cuh): each token's 2R row sums (S k, S q) over a row's P lanes by one
// reduce-scatter, then R shuffles bring every row's S k sum to its P lanes (R + 2R - 1 shuffles or so, not 2R log2 P;
// ncu, bf16 batch 64 T = 2: half of the warps' stall samples were in the passes, mostly short scoreboard on the
// row sums' shuffles and the shared k / q loads). The same additions in the same tree: bitwise the shape without `x`.
// Row i's output is stored by the lane that holds its sum of S q, not by lane 0.
//
// TILE_SMEM 1 (launch shape label suffix `b`; one CTA per head, BV == V): the head's V x K state tile (one
// contiguous block: the pool's [HV, V, K] rows are contiguous, checked by the entries) is copied into dynamic
// shared memory by one cp.async.bulk completing an mbarrier, started by thread 0 before the CTA stages its
// inputs and waited for after; the passes read their rows from there (no next-pass registers), so a shape
// holds half the tile in registers (R = 2: 64 registers, 4 CTAs, 32 warps per SM with a bf16 tile, as
// vLLM's op runs). The same float32 operations in the same order as TILE_SMEM 0 with the same R and P:
// outputs and states are bitwise those of that shape. (A persistent form, each CTA taking items in turn
// and copying the next item's tile in while one computed, was measured slower in every cell and removed:
// docs/bench-gdn-h200.md.)

#define CL (V / BV)
#define RP ((NT / P) * R)  // rows per pass
#define CH (BV / RP)       // passes over the CTA's rows
#define NWARPS (NT / 32)
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
#ifndef TILE_SMEM
#define TILE_SMEM 0
#endif
#ifndef SHORT_CHAIN
#define SHORT_CHAIN 0
#endif
#if SHORT_CHAIN && !TILE_SMEM && CH != 1
#error "SHORT_CHAIN: the register tile in one pass (or the tile in shared memory)"
#endif
// the short chain's staging in registers (the register tile); with TILE_SMEM the short chain is the prologue's
#define REG_CHAIN (SHORT_CHAIN && !TILE_SMEM)
#if TILE_SMEM && CL > 1
#error "TILE_SMEM: one CTA per head (BV == V)"
#endif
#ifndef NORM_ASYNC
#define NORM_ASYNC 0
#endif
#ifndef GUESS_ROWS
#define GUESS_ROWS 0
#endif
#if GUESS_ROWS && !(SHORT_CHAIN && SPEC)
#error "GUESS_ROWS: the short chain's prologue (SHORT_CHAIN) of the MTP call (SPEC)"
#endif
#if NORM_ASYNC && CL == 1
#error "NORM_ASYNC: a cluster (BV < V)"
#endif

#include "rows.cuh"

#define TILE_BYTES (V * K * SB)  // (TILE_SMEM) one head's state tile, the dynamic shared memory

template <int WIDE> __device__ __forceinline__ i64 ldi(const void* p, i64 i) {
    return WIDE ? ((const i64*)p)[i] : (i64)((const int*)p)[i];
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
#if SPEC && !SHORT_CHAIN
    sl = lane == 0 ? ldi<IDX64>(indices, (i64)n * s_idx_seq + (i64)t * s_idx_tok) : 0;
#endif
}

// Request n's first token, token count and initial slot (0: none, i.e. padding or no accepted column).
__device__ __forceinline__ void resolve(int n, const void* indices, const void* num_accepted, const void* cu_seqlens,
                                        int cols, i64 s_idx_seq, i64 s_idx_tok, i64& bos, int& ntok, i64& slot0) {
#if SPEC
    bos = ldi<CU64>(cu_seqlens, n);
    ntok = (int)(ldi<CU64>(cu_seqlens, n + 1) - bos);
    const i64 acc = ldi<ACC64>(num_accepted, n);
    slot0 = (acc >= 1 && acc <= cols) ? ldi<IDX64>(indices, (i64)n * s_idx_seq + (acc - 1) * s_idx_tok) : 0;
#else
    bos = n;
    ntok = 1;
    slot0 = ldi<IDX64>(indices, (i64)n * s_idx_seq);
#endif
}

#if SHORT_CHAIN
// resolve()'s values with one memory round trip: every lane loads the request's bounds, its num_accepted and
// index column `lane` (iv; 0 beyond cols) at once, and the initial slot is column num_accepted - 1's lane's
// (every lane of the warp calls it)
__device__ __forceinline__ void resolve_lanes(int n, const void* indices, const void* num_accepted,
                                              const void* cu_seqlens, int cols, i64 s_idx_seq, i64 s_idx_tok,
                                              int lane, i64& bos, int& ntok, i64& slot0, i64& iv) {
#if SPEC
    bos = ldi<CU64>(cu_seqlens, n);
    const i64 eos = ldi<CU64>(cu_seqlens, n + 1);
    const i64 acc = ldi<ACC64>(num_accepted, n);
    iv = lane < cols ? ldi<IDX64>(indices, (i64)n * s_idx_seq + (i64)lane * s_idx_tok) : 0;
    ntok = (int)(eos - bos);
    const i64 s0 = __shfl_sync(0xffffffffu, iv, (int)((acc - 1) & 31));
    slot0 = (acc >= 1 && acc <= cols) ? s0 : 0;
#else
    bos = n;
    ntok = 1;
    slot0 = ldi<IDX64>(indices, (i64)n * s_idx_seq);
    iv = slot0;
#endif
}
#endif

// (sm_90) an mbarrier (TILE_SMEM: the tile's copy; NORM_ASYNC: the norm's partial sums)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
#if TILE_SMEM
// a bulk copy global -> shared completing an mbarrier (bytes counted by the transaction count)
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    // (no reads of the buffer precede the copy: the proxy fence orders nothing here, kept as measured)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
#endif

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

#if NORM_ASYNC
// store f to the same shared variable (at generic address p) of cluster CTA `rank`, completing 4 bytes of the
// transaction count of that CTA's mbarrier (bar: this CTA's shared address of the same mbarrier)
__device__ __forceinline__ void st_cluster_async(float* p, int rank, float f, unsigned bar) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    unsigned ra, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(bar), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(ra),
                 "r"(__float_as_uint(f)), "r"(rb) : "memory");
}
#endif

#if GUESS_ROWS
// (warp 0) the token rows request n would have in a batch of `cols` tokens per request (first token n * cols, as
// in vLLM's pure spec-verify batches) to L2: q, k and v of x and the gate z, while cu_seqlens is in flight. A
// hint only: the real rows are loaded from cu_seqlens afterwards, whatever the batch.
__device__ __forceinline__ void guess_rows(const void* x, const void* z, int n, int h, int hv, int cols, i64 s_x_tok,
                                           i64 s_z_tok, i64 s_z_head, int lane) {
    constexpr int XB = X_KIND == 0 ? 4 : 2, ZB = Z_KIND == 0 ? 4 : 2;
    constexpr int LK = (K * XB + 127) / 128, LV = (V * XB + 127) / 128, LZ = (V * ZB + 127) / 128;
    constexpr int PER = 2 * LK + LV + LZ;  // 128-byte lines per token
    for (int l = lane; l < PER * cols; l += 32) {
        const i64 tok = (i64)n * cols + l / PER;
        const int w = l % PER;
        const char* a;
        if (w < 2 * LK)
            a = (const char*)x + (tok * s_x_tok + (w < LK ? h * K : H * K + h * K)) * XB + (w % LK) * 128;
        else if (w < 2 * LK + LV)
            a = (const char*)x + (tok * s_x_tok + 2 * H * K + (i64)hv * V) * XB + (w - 2 * LK) * 128;
        else
            a = (const char*)z + (tok * s_z_tok + (i64)hv * s_z_head) * ZB + (w - 2 * LK - LV) * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}
#endif

#if SHORT_CHAIN
// the short chain's item (request nh / HV, value head nh % HV): with GUESS_ROWS warp 0 first sends the guessed token
// rows to L2, then every lane resolves the item (resolve_lanes)
__device__ __forceinline__ void resolve_chain(int nh, const void* x, const void* z, const void* indices,
                                              const void* num_accepted, const void* cu_seqlens, int cols, i64 s_x_tok,
                                              i64 s_z_tok, i64 s_z_head, i64 s_idx_seq, i64 s_idx_tok, int warp,
                                              int lane, i64& bos, int& ntok, i64& slot0, i64& iv) {
#if GUESS_ROWS
    if (warp == 0) guess_rows(x, z, nh / HV, (nh % HV) / (HV / H), nh % HV, cols, s_x_tok, s_z_tok, s_z_head, lane);
#endif
    resolve_lanes(nh / HV, indices, num_accepted, cu_seqlens, cols, s_idx_seq, s_idx_tok, lane, bos, ntok, slot0, iv);
}
#endif

extern "C" __global__ void CLUSTER_ATTR __launch_bounds__(NT, MINB) gdn_fused_step(
    const void* __restrict__ x, const void* __restrict__ a, const void* __restrict__ b, const void* __restrict__ A_log,
    const void* __restrict__ dt_bias, void* __restrict__ out, void* state, const void* __restrict__ indices,
    const void* __restrict__ num_accepted, const void* __restrict__ cu_seqlens, const void* __restrict__ z,
    const void* __restrict__ norm_w, float scale, float norm_eps, int cols, i64 s_x_tok, i64 s_a_tok, i64 s_b_tok,
    i64 s_o_tok, i64 s_z_tok, i64 s_z_head, i64 s_state_slot, i64 s_idx_seq, i64 s_idx_tok, int n_items) {
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
    const int row0 = rank * BV;
#if TILE_SMEM
    extern __shared__ __align__(128) unsigned char tbuf[];  // the item's state tile (TILE_BYTES)
    __shared__ __align__(8) unsigned long long tbar;        // completed by the tile's copy
    const unsigned bar = (unsigned)__cvta_generic_to_shared(&tbar), dst = (unsigned)__cvta_generic_to_shared(tbuf);
#if SHORT_CHAIN
    // every lane resolves the item at once (resolve_lanes: one round trip), then thread 0 starts the tile's copy
    const int nh = blockIdx.x;
    i64 bos, slot0, iv;
    int ntok;
    resolve_chain(nh, x, z, indices, num_accepted, cu_seqlens, cols, s_x_tok, s_z_tok, s_z_head, s_idx_seq, s_idx_tok,
                  warp, lane, bos, ntok, slot0, iv);
    if (tid == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (ntok > 0 && slot0 > 0)
            bulk_load(dst, (const char*)state + (slot0 * s_state_slot + (i64)(nh % HV) * V * K) * SB, TILE_BYTES, bar);
    }
    __syncthreads();  // (the barrier initialised before any thread waits on it)
#else
    __shared__ i64 info[3];                                 // the item's bos, ntok, slot0 (from thread 0)
    if (tid == 0) {  // the item's chain; its tile's copy started where it has a state
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if ((int)blockIdx.x < n_items) {
            i64 b_, s_;
            int n_;
            resolve(blockIdx.x / HV, indices, num_accepted, cu_seqlens, cols, s_idx_seq, s_idx_tok, b_, n_, s_);
            info[0] = b_;
            info[1] = n_;
            info[2] = s_;
            const int it = blockIdx.x;
            if (info[1] > 0 && info[2] > 0)
                bulk_load(dst, (const char*)state + (info[2] * s_state_slot + (i64)(it % HV) * V * K) * SB,
                          TILE_BYTES, bar);
        }
    }
    __syncthreads();
    const int nh = blockIdx.x;
    const i64 bos = info[0];
    const int ntok = (int)info[1];
    const i64 slot0 = info[2];
#endif
#elif SHORT_CHAIN
    const int nh = blockIdx.x / CL;
    // (no dependence on the chain: loaded first)
    const float neg_A = -expf(ldf<ALOG_KIND>(A_log, nh % HV));
    const float dtb = ldf<DT_KIND>(dt_bias, nh % HV);
    i64 bos, slot0, iv;
    int ntok;
    resolve_chain(nh, x, z, indices, num_accepted, cu_seqlens, cols, s_x_tok, s_z_tok, s_z_head, s_idx_seq, s_idx_tok,
                  warp, lane, bos, ntok, slot0, iv);
#else
    const int nh = blockIdx.x / CL;
    i64 bos, slot0;
    int ntok;
    resolve(nh / HV, indices, num_accepted, cu_seqlens, cols, s_idx_seq, s_idx_tok, bos, ntok, slot0);
#endif
    const int n = nh / HV, hv = nh % HV, h = hv / (HV / H);
#if NORM_ASYNC
    // the norm's barrier: completed by the CL x nt partial sums stored into this CTA (initialised before this
    // CTA's first cluster arrival, so that every CTA's is before any store into it)
    __shared__ __align__(8) unsigned long long pbar_;
    const unsigned pbar = (unsigned)__cvta_generic_to_shared(&pbar_);
    if (tid == 0) {
        mbar_init(pbar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
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
#if REG_CHAIN
    // every staged input loaded first (registers), then the state rows; then the staging computes
    float qv[K / 32], kv[K / 32], a_t = 0.f, b_t = 0.f;
    i64 sl = 0;
    if (warp < nt) load_token(x, a, b, indices, bos, warp, n, h, hv, s_x_tok, s_a_tok, s_b_tok, s_idx_seq, s_idx_tok,
                              lane, qv, kv, a_t, b_t, sl);
#define SROWS ((TM * BV + NT - 1) / NT)
#define WROWS ((BV + NT - 1) / NT)
    float vr[SROWS], zr[SROWS], wr[WROWS];
#pragma unroll
    for (int j = 0; j < SROWS; ++j) {
        const int i = tid + j * NT;
        vr[j] = zr[j] = 0.f;
        if (i < nt * BV) {
            const i64 tok = bos + i / BV;
            const int r = row0 + i % BV;
            vr[j] = ldf<X_KIND>(x, tok * s_x_tok + 2 * H * K + (i64)hv * V + r);
            zr[j] = ldf<Z_KIND>(z, tok * s_z_tok + (i64)hv * s_z_head + r);
        }
    }
#pragma unroll
    for (int j = 0; j < WROWS; ++j) wr[j] = tid + j * NT < BV ? ldf<W_KIND>(norm_w, row0 + tid + j * NT) : 0.f;
    load_rows(S, (const char*)state + (slot0 * s_state_slot + tile) * SB, g, p);
    cluster_arrive_relaxed();  // this CTA has started (waited for before the first DSMEM store)
#pragma unroll
    for (int j = 0; j < SROWS; ++j) {
        const int i = tid + j * NT;
        if (i < nt * BV) {
            vn[i / BV][i % BV] = vr[j];
            const float zz = zr[j];
            const float sg = 1.f / (1.f + expf(-zz));
            gz[i / BV][i % BV] = SIGMOID_GATE ? sg : zz * sg;
        }
    }
#pragma unroll
    for (int j = 0; j < WROWS; ++j)
        if (tid + j * NT < BV) wn[tid + j * NT] = wr[j];
    for (int t = warp; t < nt; t += NWARPS) {
        if (t != warp)
            load_token(x, a, b, indices, bos, t, n, h, hv, s_x_tok, s_a_tok, s_b_tok, s_idx_seq, s_idx_tok, lane, qv,
                       kv, a_t, b_t, sl);
#else
#if !TILE_SMEM
    load_rows(S, (const char*)state + (slot0 * s_state_slot + tile) * SB, g, p);  // the first pass's rows
#endif
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
#endif
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int m = 0; m < K / 32; ++m) {
            sq = __fmaf_rn(qv[m], qv[m], sq);
            sk = __fmaf_rn(kv[m], kv[m], sk);
        }
        const float nq = sqrtf(__fadd_rn(warp_sum(sq), 1e-6f)), nk = sqrtf(__fadd_rn(warp_sum(sk), 1e-6f));
        const float kq = norm_qk(qv, kv, nq, nk, scale, lane, kn[t], qn[t], false, nullptr, 0);
#if SPEC && SHORT_CHAIN
        const i64 st_t = __shfl_sync(0xffffffffu, iv, t & 31);  // index column t (0 beyond cols)
#endif
        if (lane == 0) {
            const float xx = __fadd_rn(a_t, dtb);
            const float sp = xx <= 20.f ? logf(1.f + expf(xx)) : xx;
            sn[t][0] = expf(neg_A * sp);
            sn[t][1] = 1.f / (1.f + expf(-b_t));
            sn[t][2] = kq;
#if SPEC && SHORT_CHAIN
            slots[t] = st_t;
#elif SPEC
            slots[t] = sl;
#else
            slots[t] = slot0;
#endif
        }
    }
#if !REG_CHAIN
    if (!EARLY_QK) stage_rows();
#endif
    __syncthreads();
#if TILE_SMEM
    mbar_wait(bar, 0);  // the item's tile is in the buffer
#endif

    // CH passes over the CTA's rows, RP rows each: the next pass's rows are loaded before this one computes
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const i64 off = (i64)c * RP * K * SB;
#if TILE_SMEM
        load_rows(S, (const char*)tbuf + off, g, p);
        if (c + 1 == CH) __syncthreads();  // (not needed with one item per CTA; in the measured build, kept)
#else
        if (c + 1 < CH) load_rows(Sn, (const char*)state + (slot0 * s_state_slot + tile) * SB + off + RP * K * SB, g, p);
#endif
        for (int t = 0; t < nt; ++t) {
#pragma unroll
            for (int i = 0; i < R; ++i) vv[i] = vn[t][c * RP + g * R + i];
            pass<true>(S, kn[t], qn[t], vv, sn[t][0], sn[t][1], sn[t][2], p, true, o);
            store_outputs<O_KIND>(&on[t][c * RP + g * R], o, p);
            const i64 st = slots[t];
            if (st > 0) store_rows((char*)state + (st * s_state_slot + tile) * SB + off, S, g, p);
        }
        if (!TILE_SMEM && c + 1 < CH) {
#pragma unroll
            for (int e = 0; e < E; ++e) S[e] = Sn[e];
        }
    }
    __syncthreads();
#if NORM_ASYNC
    if (tid == 0)  // this phase completes when all CL x nt sums have arrived
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(pbar), "r"(CL * nt * 4)
                     : "memory");
#endif
    cluster_wait();  // (CL > 1) every CTA of the cluster has started
    // this CTA's sums of squares, pushed into every CTA of the head
    for (int t = warp; t < nt; t += NWARPS) {
        float ss = 0.f;
        for (int r = lane; r < BV; r += 32) ss = __fmaf_rn(on[t][r], on[t][r], ss);
        ss = warp_sum(ss);
#if NORM_ASYNC
        if (lane < CL) st_cluster_async(&parts[t][rank], lane, ss, pbar);
#else
        if (lane < CL) st_cluster(&parts[t][rank], lane, ss);
#endif
    }
#if NORM_ASYNC
    mbar_wait(pbar, 0);  // (no release fence: the snapshot stores are not drained here)
#elif CL > 1
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
