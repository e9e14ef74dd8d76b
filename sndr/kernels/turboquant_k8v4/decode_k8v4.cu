// TurboQuant k8v4 split-KV decode for vLLM's paged cache, on tensor cores.
//
// Three kernels, compiled together at run time by NVRTC (_cudart.py,
// cuda_decode.py), one build per model shape, with these macros defined:
//   D         head dim (64 or 128; 256 with the page kernel)
//   SP        cache stride between token rows of a page, bytes (Hk * slot)
//   PAGE      tokens per page (a multiple of 16)
//   G         query heads per KV head (1..16)
//   QBF16     1: bfloat16 queries, 0: float16
//   STAGES    copy ring depth (tiles in flight + 1)
//   NW        warp kernel: warps per block (independent work items)
//   MINB      blocks per SM asked of the register allocator
//   TAU       lazy-rescale slack, log2 units (p <= 2**TAU)
//   PAGE_CTA  1: build the page kernel (then HK, ROWP, ROWCOPY), 0: the warp kernel
//
// * tq_k8v4_decode_page (sm_90): a block per (sequence, split), a warp per KV
//   head; 16-token tiles of all heads copied by TMA (cp.async.bulk), see below.
// * tq_k8v4_decode_split (sm_89+): a warp per (sequence, KV head, split);
//   4-byte cp.async copies, one token row per instruction, into a per-warp ring.
// * tq_k8v4_merge: log-sum-exp merge of the splits (kernels._merge_kernel's
//   twin; cuda_decode picks one).
//
// Cache slot (one token, one KV head; see _layout.py):
//   [0, D) fp8 e4m3 keys | [D, D + D/2) 4-bit value codes | f16 scale | f16 zero
// Slots are 4-byte aligned only (196 bytes at D = 128).
//
// The tile math (attend_tile), shared by both split kernels, works on mma.sync
// m16n8k16 fragments built straight from the copied bytes:
//
// * scores are transposed, S^T = K Q^T: rows = 16 tokens (A = keys), n = 8
//   query heads (B = Q^T, resident in registers; G > 8 is two n-tiles), k =
//   head dims. The k order inside a 16-dim step is permuted (the dot product
//   does not care, Q gets the same permutation) so that one 32-bit key word
//   -> two cvt.rn.f16x2.e4m3x2 is a thread's A fragment, no shuffles.
// * out O^T = V^T P^T: rows = head dims, k = 16 tokens, n = heads. movmatrix
//   transposes the fp16 P' into the B fragment. The A fragment pairs two
//   tokens per register: prmt interleaves the value words of two tokens, and
//   one lop3 per register makes fp16 (1024 + code) for a low nibble or
//   (64 + code) for a high one (exact, no int->float). The offsets are removed
//   at the end through one extra MMA against ones, which sums exactly the
//   fp16 P' the other MMAs saw.
// * value = zero + scale * code: P is multiplied by scale / s_run before the
//   fp16 rounding (s_run = running max of the scales, so P' <= 2**TAU), the
//   zero is a rank-one term kept in fp32.
// * softmax state is lazy: the running max is raised, with one rescale, only
//   when a score exceeds it by TAU or a scale exceeds s_run (one warp vote per
//   tile on the common path); l and z are per-thread partial sums reduced once.
//
// Split kernels write each split's normalised partial O (float32) and its
// log2-sum-exp in the layout of kernels._merge_kernel.

typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF (__int_as_float(0xff800000u))
// The log2-sum-exp a split kernel writes for a row that saw no token of its split (its running max starts here,
// not at -inf): the merges weigh it 0, never NaN (verify_k8v4.cu, verify_wgmma.cu).
#define EMPTY_LSE (-1e30f)

#define KSTEPS (D / 16)            // k-steps of the score MMA = key words per thread per token
#define VW (D / 64)                // value words per thread per token
#define NT (D / 8)                 // n-tiles of the P@V MMA
#define KROW (D / 4 + (D >= 128 ? 4 : 0))  // words per key row in shared memory (bank padding)
#define VROW 20                    // words per value row in shared memory (bank padding)
#define SZ_OFF (16 * KROW + 16 * VROW)
#define STAGE_WORDS (16 * KROW + 16 * VROW + 16)
#define NH ((G + 7) / 8)           // n-tiles of 8 query heads
#define NT16 (D / 16)              // m-tiles of the P@V MMA (16 dims each)
#define DPL (D / 32)               // merge: dims per lane

static_assert(D == 64 || D == 128 || (D == 256 && PAGE_CTA), "head dim 64 or 128 (256: page kernel only)");
static_assert(PAGE % 16 == 0, "page size: a multiple of 16 tokens");
#ifdef QL
static_assert(G >= 1 && G <= 32, "verify_k8v4.cu: 1..32 query rows per warp");
#else
static_assert(G >= 1 && G <= 16, "1..16 query heads per KV head");
#endif

static __device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void cp4(u32 dst, u64 src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

static __device__ __forceinline__ void cp4z(u32 dst, u64 src, u32 n) {
    // n = 0: writes zeros, reads nothing
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

static __device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 two) {
    u32 r;
    asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(r) : "r"(two));
    return r;
}

static __device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

static __device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

static __device__ __forceinline__ float f16_lo(u32 w) {
    float f;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, l;\n}\n" : "=f"(f) : "r"(w));
    return f;
}

static __device__ __forceinline__ float f16_hi(u32 w) {
    float f;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, h;\n}\n" : "=f"(f) : "r"(w));
    return f;
}

static __device__ __forceinline__ float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// Programmatic dependent launch (sm_90): a split kernel lets the merge grid be
// scheduled early; the merge waits for the split grid's completion and memory
// before its first read. Both are no-ops when the merge is launched without the
// programmatic-serialization attribute, and compiled out below sm_90.
static __device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void mma(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two query values (element offset e, e+1 of a row) as fp16x2.
static __device__ __forceinline__ u32 load_q2(const unsigned short* q, bool ok) {
    if (!ok) return 0u;
    u32 w = *reinterpret_cast<const u32*>(q);
#if QBF16
    float lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xFFFF0000u);
    return pack_f16x2(lo, hi);
#else
    return w;
#endif
}

// Per-lane parts of the tile copies, fixed for the whole kernel: instruction i
// of the key copy moves token rows i * KTPI + (lane / (D / 4)), word lane % (D / 4)
// (one 128-byte row per instruction at D = 128); the value copy likewise.
#define KTPI (128 / D)             // key rows per copy instruction
#define VTPI (256 / D)             // value rows per copy instruction
struct CopyLane {
    int k_src, v_src, z_src;       // byte offsets from the tile's first row
    u32 k_dst, v_dst, z_dst;       // byte offsets in a stage
    int k_tau, v_tau;              // token row of instruction 0
};

static __device__ __forceinline__ CopyLane copy_lane(int lane) {
    CopyLane c;
    int kt = lane / (D / 4), kw = lane % (D / 4);
    c.k_tau = kt;
    c.k_src = kt * SP + 4 * kw;
    c.k_dst = 4u * (kt * KROW + (kw & 3) * KSTEPS + (kw >> 2));
    int vt = lane / (D / 8), vw = lane % (D / 8);
    c.v_tau = vt;
    c.v_src = vt * SP + D + 4 * vw;
    c.v_dst = 4u * (16 * KROW + vt * VROW + vw);
    c.z_src = (lane & 15) * SP + D + D / 2;
    c.z_dst = 4u * (SZ_OFF + (lane & 15));
    return c;
}

// Queue the copies of one 16-token tile (keys, value codes, scale|zero words)
// into a shared-memory stage. `row` is the global address of the tile's first
// token row for this KV head; `nvalid` < 16 zero-fills the rows past the end.
// The per-instruction parts are compile-time immediates.
template <bool MASKED>
static __device__ __forceinline__ void issue_tile(u32 stage, u64 row, const CopyLane& c, int lane, int nvalid) {
    const u64 ks = row + (u64)c.k_src, vs = row + (u64)c.v_src;
    const u32 kd = stage + c.k_dst, vd = stage + c.v_dst;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {  // keys: 4D words, 32 per instruction
        const u64 src = ks + (u64)(i * KTPI * SP);
        const u32 dst = kd + 4u * (i * KTPI * KROW);
        if (MASKED) cp4z(dst, src, i * KTPI + c.k_tau < nvalid ? 4u : 0u); else cp4(dst, src);
    }
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {  // value codes: 2D words
        const u64 src = vs + (u64)(i * VTPI * SP);
        const u32 dst = vd + 4u * (i * VTPI * VROW);
        if (MASKED) cp4z(dst, src, i * VTPI + c.v_tau < nvalid ? 4u : 0u); else cp4(dst, src);
    }
    if (lane < 16) {  // scale | zero << 16
        if (MASKED) cp4z(stage + c.z_dst, row + (u64)c.z_src, lane < nvalid ? 4u : 0u);
        else cp4(stage + c.z_dst, row + (u64)c.z_src);
    }
}


#if PAGE_CTA
// Stage = 16 token rows of ROWP bytes (all KV heads of the row, as in the
// cache); `stage` points at this warp's head slot in row 0.
#define VWORD(g, u) ((g) + 8 * (u))
// The key words of tokens g, g + 8 (load_frags' kw; also the warp-specialised verify kernel's score warps).
static __device__ __forceinline__ void load_kw(const u32* stage, int g, int t4, u32 (&kw)[2][KSTEPS])
{
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const u32* p = stage + (g + 8 * n) * (ROWP / 4) + t4;
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) kw[n][k] = p[4 * k];
    }
}
// The value words of tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 (load_frags' vw; also its P.V warps).
static __device__ __forceinline__ void load_vw(const u32* stage, int g, int t4, u32 (&vw)[4][VW])
{
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int tau = 2 * t4 + (i & 1) + 8 * (i >> 1);
#pragma unroll
        for (int u = 0; u < VW; ++u) vw[i][u] = stage[tau * (ROWP / 4) + D / 4 + VWORD(g, u)];
    }
}
static __device__ __forceinline__ void load_frags(
    const u32* stage, int g, int t4, u32 (&kw)[2][KSTEPS], u32 (&vw)[4][VW], u32& sz0, u32& sz1)
{
    load_kw(stage, g, t4, kw);
    load_vw(stage, g, t4, vw);
    sz0 = stage[g * (ROWP / 4) + D / 4 + D / 8];
    sz1 = stage[(g + 8) * (ROWP / 4) + D / 4 + D / 8];
}
#else
// Stage = keys [16][KROW] (word w of a row at (w & 3) * KSTEPS + (w >> 2), so a
// thread's words are contiguous), values [16][VROW], scale|zero [16].
#define VWORD(g, u) (VW * (g) + (u))
static __device__ __forceinline__ void load_frags(
    const u32* stage, int g, int t4, u32 (&kw)[2][KSTEPS], u32 (&vw)[4][VW], u32& sz0, u32& sz1)
{
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const u32* p = stage + (g + 8 * n) * KROW + t4 * KSTEPS;
#pragma unroll
        for (int k = 0; k < KSTEPS; k += 4) {
            uint4 v = *reinterpret_cast<const uint4*>(p + k);
            kw[n][k] = v.x; kw[n][k + 1] = v.y; kw[n][k + 2] = v.z; kw[n][k + 3] = v.w;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int tau = 2 * t4 + (i & 1) + 8 * (i >> 1);
        const u32* p = stage + 16 * KROW + tau * VROW + VW * g;
#if D == 128
        uint2 v = *reinterpret_cast<const uint2*>(p);
        vw[i][0] = v.x; vw[i][1] = v.y;
#else
        vw[i][0] = p[0];
#endif
    }
    sz0 = stage[SZ_OFF + g];
    sz1 = stage[SZ_OFF + g + 8];
}
#endif

// Tiles of a sequence and how its splits share them: the same arithmetic as
// kernels._active_splits (16-token tiles), in every kernel that needs it.
struct Split {
    int n_tiles, tiles_per, n_act;  // n_act: splits that hold tokens
};

static __device__ __forceinline__ Split split_of(int seq_len, int S, int min_tiles) {
    Split r;
    r.n_tiles = (seq_len + 15) >> 4;
    const int act = min(S, (r.n_tiles + min_tiles - 1) / min_tiles);
    r.tiles_per = max((r.n_tiles + max(act, 1) - 1) / max(act, 1), 1);
    r.n_act = (r.n_tiles + r.tiles_per - 1) / r.tiles_per;
    return r;
}

// Q^T fragments (B operand of S^T) of KV head hk's query group, k-permuted:
// step k holds dims 16 k + 4 t4 + {0, 1} | {2, 3} of head 8 nh + g (zeros past G).
static __device__ __forceinline__ void load_q_frags(
    u32 (&qb)[NH][KSTEPS][2], const unsigned short* __restrict__ Q, int b, int hk,
    long long q_sb, long long q_sh, int g, int t4)
{
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        const int h = 8 * nh + g;
        const unsigned short* q = Q + b * q_sb + (long long)(hk * G + (h < G ? h : 0)) * q_sh + 4 * t4;
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) {
            qb[nh][k][0] = load_q2(q + 16 * k, h < G);
            qb[nh][k][1] = load_q2(q + 16 * k + 2, h < G);
        }
    }
}

struct State {
    float o[NT16][NH][4];  // O^T = sum p' * (offset + code): rows = dims, cols = heads 2 t4 + {0, 1}
    float sp[NH][2];       // sum p' per head (the ones MMA)
    float m[NH][2];        // running max per head, log2 units
    float l[NH][2];        // per-thread partial sums of p
    float z[NH][2];        // per-thread partial sums of p * zero
    float s_run;           // running max of the value scales (warp-uniform)
    float inv_s;
};

static __device__ __forceinline__ void init_state(State& st) {
#pragma unroll
    for (int j = 0; j < NT16; ++j)
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) st.o[j][nh][0] = st.o[j][nh][1] = st.o[j][nh][2] = st.o[j][nh][3] = 0.f;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        st.sp[nh][0] = st.sp[nh][1] = 0.f;
        st.m[nh][0] = st.m[nh][1] = NEG_INF;
        st.l[nh][0] = st.l[nh][1] = st.z[nh][0] = st.z[nh][1] = 0.f;
    }
    st.s_run = 1e-30f;  // no scale seen yet (a zero scale gives P' = 0, never 0 * inf)
    st.inv_s = 1e30f;
}

// The lazy rescale (softmax_tile, verify_k8v4.cu's softmax_tile_mma): each head's running max raised to
// tmax (log2 units) and s_run to smax where they are larger; o, sp, l and z rescaled to match; then
// per_head(nh) for each n-tile of heads, after its rescale (inside the same loop: a separate loop after this
// one gives verify_k8v4.cu's builds other SASS, benchmarks/tq_sass_digest.py). scale_o(nh, e, f) applies
// column (nh, e)'s factor f to the accumulators: scale_o_sp (below) scales o and sp in place; the
// warp-specialised verify kernel (verify_k8v4.cu, WSP) hands f to the warp that holds them.
template <typename PerHead, typename ScaleO>
static __device__ __forceinline__ void rescale_state(State& st, const float (&tmax)[NH][2], float smax,
                                                     PerHead per_head, ScaleO scale_o) {
    const float s_new = fmaxf(st.s_run, smax);
    const float ratio = st.s_run / s_new;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float m_new = fmaxf(st.m[nh][e], tmax[nh][e]);  // stays >= -1e30: never -inf
            const float alpha = ex2(st.m[nh][e] - m_new);
            const float f = alpha * ratio;
            scale_o(nh, e, f);
            st.l[nh][e] *= alpha; st.z[nh][e] *= alpha;
            st.m[nh][e] = m_new;
        }
        per_head(nh);
    }
    st.s_run = s_new;
    st.inv_s = 1.0f / s_new;
}

// Column (nh, e) of o and sp times f (rescale_state's accumulators, where this warp holds them).
static __device__ __forceinline__ void scale_o_sp(State& st, int nh, int e, float f) {
#pragma unroll
    for (int j = 0; j < NT16; ++j) { st.o[j][nh][e] *= f; st.o[j][nh][2 + e] *= f; }
    st.sp[nh][e] *= f;
}

template <typename PerHead>
static __device__ __forceinline__ void rescale_state(State& st, const float (&tmax)[NH][2], float smax,
                                                     PerHead per_head) {
    rescale_state(st, tmax, smax, per_head, [&](int nh, int e, float f) { scale_o_sp(st, nh, e, f); });
}

static __device__ __forceinline__ u32 movmatrix_t(u32 x) {
    u32 r;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

// The lazy online softmax of one tile (t: this thread's scores, log2 units, masked ones -inf) and the B
// fragments of P' = p * scale / s_run (fp16, transposed by movmatrix) for the P.V MMAs. The running
// max is raised, with one rescale, only when a score exceeds it by TAU or a scale exceeds s_run (one
// warp vote per tile on the common path). Shared by attend_tile and verify_k8v4.cu's tile functions.
static __device__ __forceinline__ void softmax_tile(
    State& st, const float (&t)[NH][4], const float (&sc)[2], const float (&zr)[2], u32 (&pb)[NH][2])
{
    float smax = fmaxf(sc[0], sc[1]);
    bool need = smax > st.s_run;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
        need = need || fmaxf(t[nh][0], t[nh][2]) > st.m[nh][0] + TAU || fmaxf(t[nh][1], t[nh][3]) > st.m[nh][1] + TAU;
    if (__any_sync(0xffffffffu, need)) {
        float tmax[NH][2];
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) { tmax[nh][0] = fmaxf(t[nh][0], t[nh][2]); tmax[nh][1] = fmaxf(t[nh][1], t[nh][3]); }
#pragma unroll
        for (int x = 4; x <= 16; x <<= 1) {
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                tmax[nh][0] = fmaxf(tmax[nh][0], __shfl_xor_sync(0xffffffffu, tmax[nh][0], x));
                tmax[nh][1] = fmaxf(tmax[nh][1], __shfl_xor_sync(0xffffffffu, tmax[nh][1], x));
            }
            smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, x));
        }
        rescale_state(st, tmax, smax, [](int) {});
    }

    const float w0 = sc[0] * st.inv_s, w1 = sc[1] * st.inv_s;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = ex2(t[nh][i] - st.m[nh][i & 1]);  // masked: ex2(-inf) = 0
        st.l[nh][0] += p[0] + p[2];
        st.l[nh][1] += p[1] + p[3];
        st.z[nh][0] = fmaf(p[0], zr[0], fmaf(p[2], zr[1], st.z[nh][0]));
        st.z[nh][1] = fmaf(p[1], zr[0], fmaf(p[3], zr[1], st.z[nh][1]));
        pb[nh][0] = movmatrix_t(pack_f16x2(p[0] * w0, p[1] * w0));
        pb[nh][1] = movmatrix_t(pack_f16x2(p[2] * w1, p[3] * w1));
    }
}

// st.sp += the sum over the tile's tokens of the fp16 P' in pb (an MMA with an all-ones A), from which the epilogue
// removes the code offsets (PV_MMA; verify_k8v4.cu's attend_tile_shu).
static __device__ __forceinline__ void sum_p(State& st, const u32 (&pb)[NH][2]) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        float c[4] = {st.sp[nh][0], st.sp[nh][1], 0.f, 0.f};
        mma(c, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u, pb[nh][0], pb[nh][1]);
        st.sp[nh][0] = c[0]; st.sp[nh][1] = c[1];
    }
}

// P@V of one tile from the value words vw (attend_tile; verify_k8v4.cu's attend_tile_causal), then sum_p.
// O^T += V^T P^T: A pairs tokens (2 t4, 2 t4 + 1) and (2 t4 + 8, 2 t4 + 9); m-tile 4 u + i holds byte i of word u:
// low nibbles (1024 + code) in rows 0..7, high (64 + code) in 8..15.
// A statement macro, not a __forceinline__ function: every function form tried (the whole block; one value word
// per call in the caller's loop; a template; the arrays by reference, st whole or st.o / st.sp) changed the SASS of
// the D = 64 verify build's tq_k8v4_decode_page_merged (MOV / IMAD.MOV swaps; benchmarks/tq_sass_digest.py).
#define PV_MMA(st, vw, pb)                                                                                  \
    do {                                                                                                   \
        _Pragma("unroll") for (int u = 0; u < VW; ++u) {                                                   \
            u32 x[2][4];                                                                                   \
            _Pragma("unroll") for (int hh = 0; hh < 2; ++hh) {                                             \
                u32 a = vw[2 * hh][u], b = vw[2 * hh + 1][u];                                              \
                u32 lo = prmt(a, b, 0x5410u); /* [a0 a1 b0 b1] */                                          \
                u32 hi = prmt(a, b, 0x7632u); /* [a2 a3 b2 b3] */                                          \
                x[hh][0] = lo; x[hh][1] = lo >> 8; x[hh][2] = hi; x[hh][3] = hi >> 8;                      \
            }                                                                                              \
            _Pragma("unroll") for (int i = 0; i < 4; ++i) {                                                \
                const u32 a0 = (x[0][i] & 0x000F000Fu) | 0x64006400u;                                      \
                const u32 a1 = (x[0][i] & 0x00F000F0u) | 0x54005400u;                                      \
                const u32 a2 = (x[1][i] & 0x000F000Fu) | 0x64006400u;                                      \
                const u32 a3 = (x[1][i] & 0x00F000F0u) | 0x54005400u;                                      \
                _Pragma("unroll") for (int nh = 0; nh < NH; ++nh)                                          \
                    mma(st.o[4 * u + i][nh], a0, a1, a2, a3, pb[nh][0], pb[nh][1]);                        \
            }                                                                                              \
        }                                                                                                  \
        sum_p(st, pb);                                                                                     \
    } while (0)

// One tile of 16 tokens. Scores are computed transposed, S^T = K Q^T (rows =
// tokens, n = 8 heads: no MMA row is wasted for G = 8), so this thread holds
// tokens g, g + 8 for heads 2 t4, 2 t4 + 1; movmatrix turns P' into the B
// fragment of O^T = V^T P^T (rows = dims, k = tokens, n = heads).
template <bool MASKED>
static __device__ __forceinline__ void attend_tile(
    State& st, const u32 (&qb)[NH][KSTEPS][2], const u32* stage, int g, int t4, int nvalid, float qk_scale)
{
    // ---- fragments from shared memory
    u32 kw[2][KSTEPS];  // tokens g, g + 8: key words 4 k + t4
    u32 vw[4][VW];      // tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9: value words VWORD(g, u)
    u32 sz0, sz1;       // scale | zero of tokens g, g + 8
    load_frags(stage, g, t4, kw, vw, sz0, sz1);
    if (MASKED) {  // rows past the end may hold stale bytes: no NaN/inf scale may leak in
        if (g >= nvalid) sz0 = 0u;
        if (g + 8 >= nvalid) sz1 = 0u;
    }
    const float sc[2] = {f16_lo(sz0), f16_lo(sz1)}, zr[2] = {f16_hi(sz0), f16_hi(sz1)};

    // ---- S^T: A = keys (tokens g, g + 8), one 32-bit word -> two fp16x2 per token
    u32 ka[KSTEPS][4];
#pragma unroll
    for (int k = 0; k < KSTEPS; ++k) {
        ka[k][0] = e4m3x2_to_f16x2(kw[0][k]);
        ka[k][1] = e4m3x2_to_f16x2(kw[1][k]);
        ka[k][2] = e4m3x2_to_f16x2(kw[0][k] >> 16);
        ka[k][3] = e4m3x2_to_f16x2(kw[1][k] >> 16);
    }
    float t[NH][4];  // [tok g | head 2t4, tok g | 2t4+1, tok g+8 | 2t4, tok g+8 | 2t4+1]
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) mma(c, ka[k][0], ka[k][1], ka[k][2], ka[k][3], qb[nh][k][0], qb[nh][k][1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) t[nh][i] = c[i] * qk_scale;
        if (MASKED) {
            if (g >= nvalid) { t[nh][0] = NEG_INF; t[nh][1] = NEG_INF; }
            if (g + 8 >= nvalid) { t[nh][2] = NEG_INF; t[nh][3] = NEG_INF; }
        }
    }

    // ---- lazy softmax state, P' = p * scale / s_run in fp16, transposed into the B fragment of P@V
    u32 pb[NH][2];
    softmax_tile(st, t, sc, zr, pb);

    PV_MMA(st, vw, pb);
}

// ---- epilogue: reduce l, z over the 8 lanes of a head, remove the code
// offsets, store this split's normalised partial output and log2-sum-exp of
// query head q (0..HQ) at O + row(q) * D and L[row(q)] (the merge layout's
// global rows, or a block's shared-memory rows).
template <typename Row>
static __device__ __forceinline__ void store_partials(
    const State& st, float* O, float* L, Row row_of, int hk, int g, int t4)
{
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float l = st.l[nh][e], z = st.z[nh][e];
#pragma unroll
            for (int x = 4; x <= 16; x <<= 1) {
                l += __shfl_xor_sync(0xffffffffu, l, x);
                z += __shfl_xor_sync(0xffffffffu, z, x);
            }
            const int h = 8 * nh + 2 * t4 + e;
            if (h >= G) continue;
            const float inv_l = 1.0f / l, sp = st.sp[nh][e], sr = st.s_run;
            const long long row = row_of(hk * G + h);
            // m-tile 4 u + i, row half h <-> dim 8 VWORD(g, u) + 2 i + h
#pragma unroll
            for (int j = 0; j < NT16; j += 2) {  // m-tiles j = 4 u + i, j + 1
                float4 v;
                v.x = (sr * (st.o[j][nh][e] - 1024.f * sp) + z) * inv_l;
                v.y = (sr * (st.o[j][nh][2 + e] - 64.f * sp) + z) * inv_l;
                v.z = (sr * (st.o[j + 1][nh][e] - 1024.f * sp) + z) * inv_l;
                v.w = (sr * (st.o[j + 1][nh][2 + e] - 64.f * sp) + z) * inv_l;
                *reinterpret_cast<float4*>(O + row * D + 8 * VWORD(g, j / 4) + 2 * (j % 4)) = v;
            }
            if (g == 0) L[row] = st.m[nh][e] + __log2f(l);
        }
    }
}

// The partial row a verify kernel (verify_k8v4.cu, verify_wgmma.cu) writes for query token t of ql of request b, head h
// of KV head hk's gq (nhq query heads), split s of S: the merges read it as decode row b * ql + t, head hk * gq + h.
static __device__ __forceinline__ long long verify_part_row(int b, int t, int hk, int h, int ql, int gq, int nhq, int S,
                                                            int s) {
    return ((long long)b * (ql * nhq) + t * nhq + hk * gq + h) * S + s;
}

// The partials of split s of sequence b in the merge layout: row (b * HQ + h) * S + s.
static __device__ __forceinline__ void write_partials(
    const State& st, float* __restrict__ MID_O, float* __restrict__ MID_L,
    int b, int hk, int HQ, int S, int s, int g, int t4)
{
    store_partials(st, MID_O, MID_L, [&](int q) { return ((long long)(b * HQ + q)) * S + s; }, hk, g, t4);
}

// Output element d of a row, in the caller's dtype (0 float32, 1 float16, 2 bfloat16): the merges' one store
// (merge_head, write_empty, merge_block), outside #if PAGE_CTA since the warp kernel's merge_block uses it too.
static __device__ __forceinline__ void store_out(void* OUT, long long o, float r, int out_kind) {
    if (out_kind == 0) {
        reinterpret_cast<float*>(OUT)[o] = r;
    } else {
        unsigned short v;
        if (out_kind == 1) asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(v) : "f"(r));
        else asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(v) : "f"(r));
        reinterpret_cast<unsigned short*>(OUT)[o] = v;
    }
}

// The weights of one warp's merge of n <= 128 split rows of a query head, from their log2-sum-exps l[0..n) (CG:
// read through L2, written by other blocks of the same grid): lane holds splits lane + 32 i, wt[i] = 2^(l - m) (0
// past n), m is their max and den the sum of every weight (warp reductions). merge_head and tq_k8v4_merge_rows.
template <bool CG>
static __device__ __forceinline__ void merge_weights(const float* __restrict__ l, int n, int lane, float (&wt)[4],
                                                     float& m, float& den)
{
    m = NEG_INF;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int sp = lane + 32 * i;
        wt[i] = sp < n ? (CG ? __ldcg(l + sp) : l[sp]) : NEG_INF;
        m = fmaxf(m, wt[i]);
    }
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, x));
    den = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        wt[i] = lane + 32 * i < n ? ex2(wt[i] - m) : 0.f;
        den += wt[i];
    }
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) den += __shfl_xor_sync(0xffffffffu, den, x);
}

#if !PAGE_CTA
extern "C" __global__ void __launch_bounds__(NW * 32, MINB) tq_k8v4_decode_split(
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,
    const int* __restrict__ BT, const int* __restrict__ SL,
    float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int B, int NKV, int HQ, int S, int min_tiles,
    long long q_sb, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead)
{
    extern __shared__ __align__(16) u32 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int item = blockIdx.x * NW + warp;
    const int s = item % S, bh = item / S, hk = bh % NKV, b = bh / NKV;
    if (b >= B) return;
    const int seq_len = SL[b];
    const Split split = split_of(seq_len, S, min_tiles);
    const int n_tiles = split.n_tiles, tiles_per = split.tiles_per;
    if (s >= split.n_act) return;
    const int t_begin = s * tiles_per;
    const int t_end = min(t_begin + tiles_per, n_tiles);
    const int tail = seq_len & 15;  // valid rows of the sequence's last tile (0: full)
    pdl_launch_dependents();

    const int g = lane >> 2, t4 = lane & 3;

    u32 qb[NH][KSTEPS][2];
    load_q_frags(qb, Q, b, hk, q_sb, q_sh, g, t4);
    State st;
    init_state(st);

    u32* ring = smem + warp * (STAGES * STAGE_WORDS);
    const u32 ring_addr = smem_addr(ring);
    const u64 kv_head = (u64)KV + (u64)(hk * kv_shead);
    const int* bt_row = BT + b * bt_sb;
    const CopyLane cl = copy_lane(lane);

    // tile T starts at token 16 T: page (16 T) / PAGE, row (16 T) % PAGE
    auto tile_row = [&](int T, int pg) -> u64 {
        return kv_head + (u64)((long long)pg * kv_sblk) + (u64)(((16 * T) % PAGE) * SP);
    };
    auto issue = [&](int T, int slot, int pg) {
        u32 stage = ring_addr + 4u * (u32)(slot * STAGE_WORDS);
        if (T == n_tiles - 1 && tail) issue_tile<true>(stage, tile_row(T, pg), cl, lane, tail);
        else issue_tile<false>(stage, tile_row(T, pg), cl, lane, 16);
    };

    // prologue: STAGES - 1 tiles in flight
    int pg_next = bt_row[(16 * t_begin) / PAGE];
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        int T = t_begin + i;
        if (T < t_end) issue(T, i, pg_next);
        asm volatile("cp.async.commit_group;\n" ::);
        pg_next = bt_row[(16 * min(T + 1, t_end - 1)) / PAGE];
    }

    int slot = 0, slot_issue = STAGES - 1;
    for (int T = t_begin; T < t_end; ++T) {
        const int Tn = T + STAGES - 1;
        if (Tn < t_end) issue(Tn, slot_issue, pg_next);
        asm volatile("cp.async.commit_group;\n" ::);
        pg_next = bt_row[(16 * min(Tn + 1, t_end - 1)) / PAGE];  // used next iteration
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
        __syncwarp();
        const u32* stage = ring + slot * STAGE_WORDS;
        if (T == n_tiles - 1 && tail) attend_tile<true>(st, qb, stage, g, t4, tail, qk_scale);
        else attend_tile<false>(st, qb, stage, g, t4, 16, qk_scale);
        __syncwarp();  // the stage is refilled next iteration
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        slot_issue = slot_issue + 1 == STAGES ? 0 : slot_issue + 1;
    }

    write_partials(st, MID_O, MID_L, b, hk, HQ, S, s, g, t4);
}
#endif  // !PAGE_CTA

#if PAGE_CTA
// ---------------------------------------------------------------------------
// One block per (sequence, split), one warp per KV head (HK warps): the block
// streams whole tiles of 16 token rows x all heads, which are contiguous in
// the cache, with TMA bulk copies (cp.async.bulk) into a ring of STAGES
// stages; every sector of the cache is fetched once and no thread spends
// instructions on copies. ROWCOPY = 1: one copy per row into rows padded to
// ROWP bytes (conflict-free fragment reads); 0: one copy of the whole tile.
// Full/empty mbarriers per stage: the copies complete the full barrier, each
// warp arrives on the empty one after reading, warp 0 refills.

static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
static __device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
#ifndef EVF
#define EVF 0  // 1: the cache is read with an L2 evict-first policy (read once: its lines go first)
#endif
static __device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
#if EVF
    u64 pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
#else
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

#define STAGE_BYTES (16 * ROWP)

// The page kernel's work for block (b, s), s < split.n_act: the softmax state
// of warp hk's query heads over the split's tiles (the ring is free again once
// every warp has returned).
static __device__ __forceinline__ void page_attend(
    State& st, const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,
    const int* __restrict__ BT, float qk_scale, int b, int s, int seq_len, const Split& split,
    long long q_sb, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, hk = threadIdx.x >> 5;
    const int n_tiles = split.n_tiles, tiles_per = split.tiles_per;
    const int t_begin = s * tiles_per;
    const int t_end = min(t_begin + tiles_per, n_tiles);
    const int tail = seq_len & 15;
    const int g = lane >> 2, t4 = lane & 3;

    const u32 ring = smem_addr(smem);
    const u32 bars = ring + STAGES * STAGE_BYTES;  // full[STAGES], empty[STAGES], 8 bytes each
    const int* bt_row = BT + b * bt_sb;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < STAGES; ++i) { mbar_init(bars + 8 * i, 1); mbar_init(bars + 8 * (STAGES + i), HK); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // block-table entries of the first STAGES - 1 tiles, one lane each
    int pg_pre = 0;
    if (hk == 0 && lane < STAGES - 1) pg_pre = bt_row[(16 * min(t_begin + lane, t_end - 1)) / PAGE];
    __syncthreads();

    auto produce = [&](int T, int slot, int pg) {  // warp 0, all lanes
        const unsigned char* src = KV + (long long)pg * kv_sblk + (long long)((16 * T) % PAGE) * SP;
        const u32 full = bars + 8 * slot, dst = ring + slot * STAGE_BYTES;
        if (lane == 0) mbar_expect(full, 16 * SP);
        __syncwarp();
#if ROWCOPY
        if (lane < 16) bulk_copy(dst + lane * ROWP, src + lane * SP, SP, full);
#else
        if (lane == 0) bulk_copy(dst, src, 16 * SP, full);
#endif
    };

    if (hk == 0) {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            const int pg = __shfl_sync(0xffffffffu, pg_pre, i);
            if (t_begin + i < t_end) produce(t_begin + i, i, pg);
        }
    }
    int pg_next = 0;
    if (hk == 0 && lane == 0) pg_next = bt_row[(16 * min(t_begin + STAGES - 1, t_end - 1)) / PAGE];

    u32 qb[NH][KSTEPS][2];
    load_q_frags(qb, Q, b, hk, q_sb, q_sh, g, t4);
    init_state(st);

    const unsigned char* my = smem + hk * kv_shead;  // this head's slot in row 0 of a stage
    int slot = 0;
    u32 phase = 0;  // parity of the current use of `slot`; bit i for stage i
    u32 empty_phase = 0;
    for (int T = t_begin; T < t_end; ++T) {
        if (hk == 0) {  // refill the stage freed by tile T - 1 with tile T + STAGES - 1
            const int Tn = T + STAGES - 1;
            const int sn = slot == 0 ? STAGES - 1 : slot - 1;
            const int pg = __shfl_sync(0xffffffffu, pg_next, 0);
            if (Tn < t_end) {
                if (T > t_begin) {  // stage sn held tile T - 1: wait until every warp read it
                    mbar_wait(bars + 8 * (STAGES + sn), (empty_phase >> sn) & 1);
                    empty_phase ^= 1u << sn;
                }
                produce(Tn, sn, pg);
                if (lane == 0) pg_next = bt_row[(16 * min(Tn + 1, t_end - 1)) / PAGE];
            }
        }
        mbar_wait(bars + 8 * slot, (phase >> slot) & 1);
        phase ^= 1u << slot;
        const u32* stage = reinterpret_cast<const u32*>(my + slot * STAGE_BYTES);
        if (T == n_tiles - 1 && tail) attend_tile<true>(st, qb, stage, g, t4, tail, qk_scale);
        else attend_tile<false>(st, qb, stage, g, t4, 16, qk_scale);
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + slot));
        slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
}

// page_attend, then the partials of every query head into MID_O / MID_L.
static __device__ __forceinline__ void page_split(
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,
    const int* __restrict__ BT, float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int HQ, int S, int b, int s, int seq_len, const Split& split,
    long long q_sb, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead)
{
    State st;
    page_attend(st, Q, KV, BT, qk_scale, b, s, seq_len, split, q_sb, q_sh, bt_sb, kv_sblk, kv_shead);
    const int lane = threadIdx.x & 31;
    write_partials(st, MID_O, MID_L, b, threadIdx.x >> 5, HQ, S, s, lane >> 2, lane & 3);
}

#ifndef QL  // (a verify build, verify_k8v4.cu, launches its own kernel and tq_k8v4_merge only: NVRTC skips these two)
extern "C" __global__ void __launch_bounds__(HK * 32, MINB) tq_k8v4_decode_page(
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,
    const int* __restrict__ BT, const int* __restrict__ SL,
    float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int B, int HK_, int HQ, int S, int min_tiles,
    long long q_sb, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead)
{
    const int s = blockIdx.x % S, b = blockIdx.x / S;
    const int seq_len = SL[b];
    const Split split = split_of(seq_len, S, min_tiles);
    if (s >= split.n_act) return;  // the whole block
    pdl_launch_dependents();
    page_split(Q, KV, BT, MID_O, MID_L, qk_scale, HQ, S, b, s, seq_len, split, q_sb, q_sh, bt_sb, kv_sblk, kv_shead);
}
#endif  // !QL

// One warp merges n rows of one query head, log2-sum-exp weighted: rows o + i * D
// and log2-sum-exps l[i], i < n <= 128 (read through L2: written by other blocks
// of this grid), into OUT (element offset o_off) and LSE[lse_off] (natural log).
#define FW 8  // rows a lane has in flight at once
static __device__ __forceinline__ void merge_head(
    const float* o, const float* l, int n, void* __restrict__ OUT, float* __restrict__ LSE,
    long long o_off, long long lse_off, int out_kind, int write_lse, int lane)
{
    float wt[4], m, den;  // row lane + 32 i (n <= 128)
    merge_weights<true>(l, n, lane, wt, m, den);
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
    const float* base = o + lane * DPL;
#pragma unroll 1
    for (int s0 = 0; s0 < n; s0 += FW) {
        float v[FW][DPL];
#pragma unroll
        for (int u = 0; u < FW; ++u) {
            const bool ok = s0 + u < n;
#pragma unroll
            for (int c = 0; c < DPL; c += 2) {
                float2 x = make_float2(0.f, 0.f);
                if (ok) x = __ldcg(reinterpret_cast<const float2*>(base + (long long)(s0 + u) * D + c));
                v[u][c] = x.x; v[u][c + 1] = x.y;
            }
        }
        const int q = s0 >> 5;  // FW divides 32: one weight register for the chunk
        const float wsrc = q == 0 ? wt[0] : q == 1 ? wt[1] : q == 2 ? wt[2] : wt[3];
#pragma unroll
        for (int u = 0; u < FW; ++u) {
            const float ws = __shfl_sync(0xffffffffu, wsrc, (s0 & 31) + u);
#pragma unroll
            for (int c = 0; c < DPL; ++c) acc[c] += ws * v[u][c];
        }
    }
    const float inv = 1.f / den;
#pragma unroll
    for (int c = 0; c < DPL; ++c) store_out(OUT, o_off + lane * DPL + c, acc[c] * inv, out_kind);
    if (write_lse && lane == 0) LSE[lse_off] = (m + __log2f(den)) * 0.6931471805599453f;
}

// Zeros and lse = -inf for the G query heads of KV head hk of an empty sequence (one warp).
static __device__ __forceinline__ void write_empty(
    void* __restrict__ OUT, float* __restrict__ LSE, int b, int hk, long long o_sb, long long o_sh,
    long long lse_sb, int out_kind, int write_lse, int lane)
{
    for (int j = 0; j < G; ++j) {
        const int h = hk * G + j;
        for (int d = lane; d < D; d += 32) store_out(OUT, b * o_sb + h * o_sh + d, 0.f, out_kind);
        if (write_lse && lane == 0) LSE[b * lse_sb + h] = NEG_INF;
    }
}

// The last block to arrive on *cnt of the `expect` that will (an acq_rel
// arrival: every block fences its writes first; the last one resets the counter
// for the next launch or graph replay, then fences before reading the others').
static __device__ __forceinline__ bool last_to_arrive(int* cnt, int expect) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int prev = atomicAdd(cnt, 1);
        last = prev == expect - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// The parameters of the page kernels that merge in-kernel (merged, cluster, grid):
// the split kernel's, then the arrival counters and the merge's outputs.
#define MERGING_PAGE_PARAMS                                                                         \
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,                     \
    const int* __restrict__ BT, const int* __restrict__ SL,                                         \
    float* __restrict__ MID_O, float* __restrict__ MID_L,                                           \
    float qk_scale, int B, int HK_, int HQ, int S, int min_tiles,                                   \
    long long q_sb, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead,         \
    int* __restrict__ CNT, void* __restrict__ OUT, float* __restrict__ LSE,                         \
    long long o_sb, long long o_sh, long long lse_sb, int out_kind, int write_lse

// Their start: split s of sequence b (blockIdx.x = b S + s), then the statements
// given (the cluster kernel's cluster and rank), warp hk, the sequence's splits;
// a sequence with no tokens gets zeros and -inf from its block 0 and no split of
// it runs. A macro rather than a function so that the kernels keep their own
// locals and, checked with benchmarks/tq_sass_digest.py, their exact SASS.
#define MERGING_PAGE_START(...)                                                                     \
    const int s = blockIdx.x % S, b = blockIdx.x / S;                                               \
    __VA_ARGS__                                                                                     \
    const int lane = threadIdx.x & 31, hk = threadIdx.x >> 5;                                       \
    const int seq_len = SL[b];                                                                      \
    const Split split = split_of(seq_len, S, min_tiles);                                            \
    const int n_act = split.n_act;                                                                  \
    if (n_act == 0) { /* empty sequence: no split runs; block 0 writes zeros and -inf */            \
        if (s == 0) write_empty(OUT, LSE, b, hk, o_sb, o_sh, lse_sb, out_kind, write_lse, lane);    \
        return;                                                                                     \
    }

// The page kernel with the merge folded in: the last block of each sequence to
// finish (a per-sequence arrival counter in CNT, zero between launches: the last
// block resets it) merges the splits of all its query heads, warp hk the G heads
// of KV head hk. CNT must not be shared by launches that can run concurrently.
#ifndef QL
extern "C" __global__ void __launch_bounds__(HK * 32, MINB) tq_k8v4_decode_page_merged(
    MERGING_PAGE_PARAMS)
{
    MERGING_PAGE_START()
    if (s >= n_act) return;
    page_split(Q, KV, BT, MID_O, MID_L, qk_scale, HQ, S, b, s, seq_len, split, q_sb, q_sh, bt_sb, kv_sblk, kv_shead);
    if (!last_to_arrive(CNT + b, n_act)) return;
#pragma unroll 1
    for (int j = 0; j < G; ++j) {
        const int h = hk * G + j;
        const long long row0 = ((long long)b * HQ + h) * S;
        merge_head(MID_O + row0 * D, MID_L + row0, n_act, OUT, LSE, b * o_sb + h * o_sh, b * lse_sb + h,
                   out_kind, write_lse, lane);
    }
}
#endif  // !QL

#ifdef CL
// ---------------------------------------------------------------------------
// The page kernel with the merge done by the splits themselves, in two steps:
// * a thread-block cluster of CL consecutive splits of a sequence (cluster c =
//   splits c CL .. c CL + CL - 1) reduces its CL partials through distributed
//   shared memory: each block leaves its normalised partials of all query heads
//   in its own (now idle) ring, and block rank r merges the heads of slice r
//   (HQ / CL heads) over the cluster into row c of the merge layout, so the
//   partials that reach L2 are CL times fewer;
// * per (sequence, slice), the last of the sequence's active clusters to arrive
//   (counter CNT[b * CL + r], acq_rel as in last_to_arrive, reset by that block)
//   merges slice r over those rows into OUT / LSE.
// No block waits for another except at the two cluster barriers (co-scheduled
// by the hardware), so any grid size is safe. S must be a multiple of CL.
#define HSL ((HK * G + CL - 1) / CL)  // query heads per slice
static_assert(HK * G * (D + 1) * 4 <= STAGES * STAGE_BYTES, "a block's partials must fit in its ring");

static __device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ u32 dsmem_addr(u32 local, u32 rank) {  // the same offset in block `rank`
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}
static __device__ __forceinline__ float dsmem_ld(u32 a) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
    return v;
}
static __device__ __forceinline__ float2 dsmem_ld2(u32 a) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(HK * 32, MINB) tq_k8v4_decode_page_cluster(
    MERGING_PAGE_PARAMS)
{
    extern __shared__ __align__(128) unsigned char smem[];
    MERGING_PAGE_START(const int c = s / CL, r = s % CL;)  // cluster of the sequence, rank in it (S % CL == 0)
    if (c * CL >= n_act) return;  // the whole cluster holds no tokens
    const int n_cl = (n_act + CL - 1) / CL;  // active clusters
    const int n_in = min(CL, n_act - c * CL);  // active blocks of this cluster (ranks 0 .. n_in - 1)
    float* part_o = reinterpret_cast<float*>(smem);  // [HQ][D], then the log2-sum-exps [HQ]
    float* part_l = part_o + HK * G * D;
    if (s < n_act) {
        State st;
        page_attend(st, Q, KV, BT, qk_scale, b, s, seq_len, split, q_sb, q_sh, bt_sb, kv_sblk, kv_shead);
        __syncthreads();  // every warp is done with the ring
        store_partials(st, part_o, part_l, [](int q) { return (long long)q; }, hk, lane >> 2, lane & 3);
    }
    cluster_sync_all();  // partials visible cluster-wide

    // slice r: heads h0 .. h1 - 1, warp-strided; lane holds dims lane * DPL ..
    const int h0 = r * HSL, h1 = min(HK * G, h0 + HSL);
    const u32 po = smem_addr(part_o), pl = smem_addr(part_l);
    for (int h = h0 + hk; h < h1; h += HK) {
        float lj[CL];
        float m = NEG_INF;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            lj[j] = j < n_in ? dsmem_ld(dsmem_addr(pl + 4u * h, j)) : NEG_INF;
            m = fmaxf(m, lj[j]);
        }
        float den = 0.f, acc[DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < CL; ++j) {
            if (j < n_in) {
                const float w = ex2(lj[j] - m);
                den += w;
                const u32 a = dsmem_addr(po + 4u * (h * D + lane * DPL), j);
#pragma unroll
                for (int i = 0; i < DPL; i += 2) {
                    const float2 v = dsmem_ld2(a + 4u * i);
                    acc[i] = fmaf(w, v.x, acc[i]);
                    acc[i + 1] = fmaf(w, v.y, acc[i + 1]);
                }
            }
        }
        const float inv = 1.f / den;
        const long long row = ((long long)b * HQ + h) * S + c;
        float* dst = MID_O + row * D + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; i += 2) __stcg(reinterpret_cast<float2*>(dst + i), make_float2(acc[i] * inv, acc[i + 1] * inv));
        if (lane == 0) __stcg(MID_L + row, m + __log2f(den));
    }
    cluster_sync_all();  // no block leaves while the others read its shared memory

    if (h0 >= h1 || !last_to_arrive(CNT + b * CL + r, n_cl)) return;
    for (int h = h0 + hk; h < h1; h += HK) {
        const long long row0 = ((long long)b * HQ + h) * S;
        merge_head(MID_O + row0 * D, MID_L + row0, n_cl, OUT, LSE, b * o_sb + h * o_sh, b * lse_sb + h,
                   out_kind, write_lse, lane);
    }
}
#endif  // CL
#endif  // PAGE_CTA

// ---------------------------------------------------------------------------
// Merge of the splits, one block of 8 warps per (sequence, query head):
// out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s - m), lse = m + log2(den)
// (natural log on output). Warp w sums splits w, w + 8, ... (at most 16, all
// loads issued at once) with D/32 dims per lane (vector loads); the partial
// sums meet in shared memory. The
// split count of a sequence is recomputed from its length exactly as the split
// kernels do; a sequence with no tokens gets zeros and lse = -inf.
// OUT_KIND: 0 float32, 1 float16, 2 bfloat16.
#define MW 8                 // warps per merge block (MW * 16 >= 128 splits)

static __device__ __forceinline__ float block_max(float v, float* red, int tid) {
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, x));
    if ((tid & 31) == 0) red[tid >> 5] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int i = 1; i < MW; ++i) v = fmaxf(v, red[i]);
    __syncthreads();
    return v;
}

static __device__ __forceinline__ float block_sum(float v, float* red, int tid) {
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) v += __shfl_xor_sync(0xffffffffu, v, x);
    if ((tid & 31) == 0) red[tid >> 5] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int i = 1; i < MW; ++i) v += red[i];
    __syncthreads();
    return v;
}

// Loads of the merge: CG = 1 through L2 only (rows written by other blocks of
// the same grid), 0 plain (rows of an earlier kernel).
template <bool CG> static __device__ __forceinline__ float ldm(const float* p) { return CG ? __ldcg(p) : *p; }
template <bool CG> static __device__ __forceinline__ float4 ldm4(const float* p) {
    return CG ? __ldcg(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
}
template <bool CG> static __device__ __forceinline__ float2 ldm2(const float* p) {
    return CG ? __ldcg(reinterpret_cast<const float2*>(p)) : *reinterpret_cast<const float2*>(p);
}

// Query head h of sequence b, n_act active splits, merged by one block of MW warps.
template <bool CG>
static __device__ __forceinline__ void merge_block(
    const float* __restrict__ MID_O, const float* __restrict__ MID_L, int n_act, void* __restrict__ OUT,
    float* __restrict__ LSE, int b, int h, int HQ, int S, long long o_sb, long long o_sh, long long lse_sb,
    int out_kind, int write_lse)
{
    __shared__ float w[MW * 32];
    __shared__ float red[MW];
    __shared__ __align__(16) float part[MW][D];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long row0 = ((long long)b * HQ + h) * S;

    // every load is issued at once, before the length is known (rows past the
    // active splits hold stale values: they are selected away, never multiplied)
    float lv = tid < S ? ldm<CG>(MID_L + row0 + tid) : NEG_INF;  // S <= 128 <= MW * 32
    const float* base = MID_O + row0 * D + lane * DPL;
    float ov[128 / MW][DPL];
#pragma unroll
    for (int i = 0; i < 128 / MW; ++i) {  // predicated, fully unrolled
        const int s = warp + MW * i;
#if DPL >= 4
#pragma unroll
        for (int c = 0; c < DPL / 4; ++c) {
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (s < S) v = ldm4<CG>(base + (long long)s * D + 4 * c);
            ov[i][4 * c] = v.x; ov[i][4 * c + 1] = v.y; ov[i][4 * c + 2] = v.z; ov[i][4 * c + 3] = v.w;
        }
#else
        float2 v = make_float2(0.f, 0.f);
        if (s < S) v = ldm2<CG>(base + (long long)s * D);
        ov[i][0] = v.x; ov[i][1] = v.y;
#endif
    }
    if (tid >= n_act) lv = NEG_INF;
    const float m = block_max(lv, red, tid);
    const float wt = tid < n_act ? ex2(lv - m) : 0.f;
    w[tid] = wt;
    const float den = block_sum(wt, red, tid);  // its barriers also publish w[]

    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 128 / MW; ++i) {
        const int s = warp + MW * i;
        if (s < n_act) {
            const float ws = w[s];
#pragma unroll
            for (int j = 0; j < DPL; ++j) acc[j] += ws * ov[i][j];
        }
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) part[warp][lane * DPL + i] = acc[i];
    __syncthreads();
    const float inv = den > 0.f ? 1.f / den : 0.f;
    for (int d = tid; d < D; d += MW * 32) {
        float r = part[0][d];
#pragma unroll
        for (int i = 1; i < MW; ++i) r += part[i][d];
        r *= inv;
        store_out(OUT, b * o_sb + h * o_sh + d, r, out_kind);
    }
    if (write_lse && tid == 0) LSE[b * lse_sb + h] = n_act > 0 ? (m + __log2f(den)) * 0.6931471805599453f : NEG_INF;
}

extern "C" __global__ void __launch_bounds__(MW * 32) tq_k8v4_merge(
    const float* __restrict__ MID_O, const float* __restrict__ MID_L, const int* __restrict__ SL,
    void* __restrict__ OUT, float* __restrict__ LSE,
    int HQ, int S, int min_tiles, long long o_sb, long long o_sh, long long lse_sb, int out_kind, int write_lse)
{
    const int b = blockIdx.x / HQ, h = blockIdx.x % HQ;
    pdl_wait();
    const int n_act = split_of(SL[b], S, min_tiles).n_act;
    merge_block<false>(MID_O, MID_L, n_act, OUT, LSE, b, h, HQ, S, o_sb, o_sh, lse_sb, out_kind, write_lse);
}

// ---------------------------------------------------------------------------
// The same merge, one WARP per (sequence, query head) row and MRW rows a block (the verify kernel's merge,
// mtp_verify.VerifyConfig.merge = "rows"). tq_k8v4_merge gives each row a block of 8 warps, three block-wide
// barriers and 16 predicated loads per warp (sized for 128 splits); at a verify step's 4-8 splits and thousands of
// rows it ran at 8-27% of DRAM bandwidth (41 us for 8192 rows of 4 splits at B = 32, K = 3, Hq 64 on an H200:
// docs/bench-mtp-verify-h200.md, "Round 6"). Here lane s holds the log2-sum-exp of splits s, s + 32, ... (S <= 128),
// the max and the denominator are warp reductions, and each lane sums its DPL dims over the active splits, four
// splits' loads in flight at a time. No shared memory, no block barrier. Same weights as merge_block (a split
// whose rows saw no token, EMPTY_LSE, weighs 0; a row with no active split gets zeros and lse = -inf).
#define MRW 8                 // rows (warps) per block
extern "C" __global__ void __launch_bounds__(MRW * 32) tq_k8v4_merge_rows(
    const float* __restrict__ MID_O, const float* __restrict__ MID_L, const int* __restrict__ SL,
    void* __restrict__ OUT, float* __restrict__ LSE,
    int HQ, int S, int min_tiles, long long o_sb, long long o_sh, long long lse_sb, int out_kind, int write_lse,
    int ROWS)
{
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * MRW + (threadIdx.x >> 5);
    pdl_wait();
    if (r >= ROWS) return;  // (whole warps)
    const int b = r / HQ, h = r % HQ;
    const int n_act = split_of(SL[b], S, min_tiles).n_act;
    const long long row0 = (long long)r * S;
    float wl[4], m, den;  // splits lane + 32 j
    merge_weights<false>(MID_L + row0, n_act, lane, wl, m, den);
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
    const float* base = MID_O + row0 * D + lane * DPL;
#pragma unroll 4
    for (int s = 0; s < n_act; ++s) {
        const int j = s >> 5;
        const float wj = j == 0 ? wl[0] : j == 1 ? wl[1] : j == 2 ? wl[2] : wl[3];
        const float ws = __shfl_sync(0xffffffffu, wj, s & 31);
#if DPL >= 4
#pragma unroll
        for (int c = 0; c < DPL / 4; ++c) {
            const float4 v = *reinterpret_cast<const float4*>(base + (long long)s * D + 4 * c);
            acc[4 * c] += ws * v.x; acc[4 * c + 1] += ws * v.y; acc[4 * c + 2] += ws * v.z; acc[4 * c + 3] += ws * v.w;
        }
#else
        const float2 v = *reinterpret_cast<const float2*>(base + (long long)s * D);
        acc[0] += ws * v.x; acc[1] += ws * v.y;
#endif
    }
    const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) store_out(OUT, b * o_sb + h * o_sh + lane * DPL + i, acc[i] * inv, out_kind);
    if (write_lse && lane == 0) LSE[b * lse_sb + h] = n_act > 0 ? (m + __log2f(den)) * 0.6931471805599453f : NEG_INF;
}

#if PAGE_CTA && defined(GM)
// ---------------------------------------------------------------------------
// The page kernel with the merge in the same grid, launched cooperatively
// (every block resident at once, or the launch fails; the plan asks for it
// only when the grid is one wave): block (b, s) computes its split, arrives on
// CNT[2 b], waits until all n_act splits of the sequence have arrived, then
// merges query heads s, s + n_act, ... of sequence b with merge_block. The
// merge is spread over the sequence's blocks as the separate merge kernel
// spreads it, with no kernel boundary in between. The last block of the
// sequence to finish (CNT[2 b + 1]) resets both counters for the next launch or
// graph replay.
static_assert(HK == MW, "grid merge: the block's KV-head warps are merge_block's MW warps");

static __device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

extern "C" __global__ void __launch_bounds__(HK * 32, MINB) tq_k8v4_decode_page_grid(
    MERGING_PAGE_PARAMS)
{
    MERGING_PAGE_START()
    if (s >= n_act) return;
    page_split(Q, KV, BT, MID_O, MID_L, qk_scale, HQ, S, b, s, seq_len, split, q_sb, q_sh, bt_sb, kv_sblk, kv_shead);
    int* cnt = CNT + 2 * b;  // arrivals, departures
    __threadfence();  // this block's partials, before its arrival (release)
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(cnt, 1);
        while (ld_acquire(cnt) < n_act) __nanosleep(32);
    }
    __syncthreads();
    for (int h = s; h < HQ; h += n_act)
        merge_block<true>(MID_O, MID_L, n_act, OUT, LSE, b, h, HQ, S, o_sb, o_sh, lse_sb, out_kind, write_lse);
    if (threadIdx.x == 0 && atomicAdd(cnt + 1, 1) == n_act - 1) {  // every block is past its wait
        cnt[0] = 0;
        cnt[1] = 0;
    }
}
#endif  // PAGE_CTA && GM
