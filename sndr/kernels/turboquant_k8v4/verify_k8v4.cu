// TurboQuant k8v4 multi-query (speculative-verify) decode: one KV read per request.
//
// Compiled by NVRTC after decode_k8v4.cu (mtp_verify.py concatenates the two
// sources), whose device functions it reuses: the TMA ring of the page kernel
// (mbarriers, cp.async.bulk), load_frags (fragments from a stage row padded to
// ROWP bytes), the mma/movmatrix/prmt helpers, State/init_state, and the merge
// kernel tq_k8v4_merge, which combines the splits written here.
//
// A verify step of speculative decoding scores QL = K + 1 query tokens per
// request: query token t of request b sees the first seq_len - K + t cached
// tokens (the K + 1 tokens being verified are already in the cache). PK0001's
// decode would need K + 1 calls, or B (K + 1) synthetic rows, and read each
// request's KV K + 1 times. Here the QL * GQ query rows of a KV head are the
// n dimension of the same transposed score MMA (S^T = K Q^T): with GQ = 4,
// K = 3 the 16 rows fill both n-tiles of one m16n8k16 step, exactly as G = 16
// does in the decode kernel, and each 16-token tile of the cache is copied
// once and scored for all rows.
//
// Macros, beyond decode_k8v4.cu's (built with PAGE_CTA = 1 and G = RC):
//   QL   query tokens per request (K + 1, 1..16)
//   GQ   query heads per KV head (the model's group size)
//   RC   rows per warp (min(QL * GQ, 16), or up to 32: wide warps, NH = 3..4 n-tiles on the tile
//        each warp unpacks once in registers); decode_k8v4.cu's G, so NH = ceil(RC / 8)
//   NCH  row chunks: ceil(QL * GQ / RC).
//   HPB  KV heads per block (divides HK); HPB < HK copies only those heads'
//        bytes of each token row (CB bytes from byte HS * HPB * group)
//   NCW  chunk warps per KV head in a block (the shared-tile CTA)
//   NCHB chunk blocks: ceil(NCH / NCW)
//   CB   bytes of a token row one block copies (SP when HPB == HK)
//   HS   bytes between the slots of two KV heads in a row (cache stride 2)
//   SMX  the per-warp kernel's softmax path: 0 softmax_tile (decode_k8v4.cu), 1
//        softmax_tile_mma (below: fewer instructions per score, l and z by MMA),
//        2 the same with ex2.approx.f16x2; the shared-unpack CTA (SHU) takes 0
//   WSP  1: the warp-specialised pair (at the end: a score warp and a P.V warp per KV
//        head, sm_90a), WS_SREG / WS_PREG their registers after setmaxnreg
//
// A block runs HPB * NCW warps: warp w serves KV head hg * HPB + w % HPB and
// row chunk cb * NCW + w / HPB, where (b, s, hg, cb) is the block. All its
// warps consume the same TMA-copied stage, so a tile is copied once per block
// for NCW * 16 query rows per KV head (up to 64 at G = 8, K = 7), not once per
// 16-row chunk. NCW = 1, HPB = HK is the one-warp-per-head kernel (chosen
// where G (K + 1) <= 16). Chunk blocks of one (request, split) are adjacent in
// launch order, so chunk blocks after the first find the tiles in L2.
//
// Rows are token-major: row r = t * GQ + h (token t, head h of the group).
// Each row keeps its own softmax state (State's per-column m, l, z, sp), so the
// causal limit is a per-column mask, applied only on the tiles that reach past
// seq_len - K (at most two). The running max starts at -1e30, not -inf: a row
// can see no token of a split (its tokens all lie past the row's limit); that
// row then writes o = 0 and a log2-sum-exp of -1e30, which the merge weighs 0
// (or, for a row that sees nothing at all, averages to 0), never NaN.
//
// Partials use the merge's layout with (K + 1) * Hq "heads" per request:
// row (b * QL * HQ + t * HQ + hq) * S + s, i.e. the output [B * QL, Hq, D] read
// as [B, QL * Hq, D]; the merge recomputes each request's split count from
// seq_len exactly as this kernel does (split_of), so both agree per request.

#ifndef QL
#error "QL (query tokens per request) must be defined"
#endif
static_assert(QL >= 1 && QL <= 16, "1..16 query tokens per request (K <= 15)");
static_assert(GQ >= 1 && GQ <= 16, "1..16 query heads per KV head");
static_assert(RC == G, "decode_k8v4.cu's G is the row chunk");
static_assert(NCH * RC >= QL * GQ && (NCH - 1) * RC < QL * GQ, "row chunks cover the rows");
static_assert(PAGE_CTA == 1, "built on the page kernel's TMA ring");
#ifndef HPB
#define HPB HK
#endif
#ifndef NCW
#define NCW 1
#endif
#ifndef NCHB
#define NCHB NCH
#endif
#ifndef CB
#define CB SP
#endif
#ifndef HS
#define HS 0
#endif
#ifndef SHU
#define SHU 0                     // 1: the shared-unpack CTA (below): each tile unpacked once per block into f16
#endif
#ifndef RING_ONLY
#define RING_ONLY 0               // 1: the per-warp kernel skips the tile math (wrong outputs): timing the TMA ring alone
#endif
#ifndef WSP
#define WSP 0                     // 1: the warp-specialised pair (below): a score warp and a P.V warp per KV head
#endif
#if WSP
#define NWB (2 * HPB)             // warps per block: HPB score warps, then HPB P.V warps
#else
#define NWB (HPB * NCW)           // warps per block
#endif
#define NHG (HK / HPB)            // KV-head groups (blocks per (request, split, chunk block))
static_assert(HK % HPB == 0, "heads per block divide the KV heads");
static_assert(NCHB * NCW >= NCH && (NCHB - 1) * NCW < NCH, "chunk blocks cover the row chunks");
static_assert(NWB <= 32, "at most 32 warps per block");
static_assert(HPB == HK ? CB == SP : (ROWCOPY == 1 && CB == HPB * HS && CB % 16 == 0 && (HS * HPB) % 16 == 0),
              "a head group's bytes are whole 16-byte rows copied per token (ROWCOPY)");

#define VR (QL * GQ)              // query rows per KV head
#ifndef KCHAIN
#define KCHAIN 1                  // score MMA accumulator chains per n-tile (1 or 2)
#endif
static_assert(KCHAIN == 1 || KCHAIN == 2, "one or two accumulator chains");
#ifndef QSMEM
#define QSMEM 0                   // 1: Q fragments in shared memory (read per tile), not registers
#endif
#ifndef SMX
#define SMX 0                     // per-score softmax path of the per-warp kernel (attend_tile_causal), see there:
#endif                            // 0 decode_k8v4.cu's softmax_tile; 1 the MMA-summed one; 2 the same with ex2.f16x2
static_assert(SMX >= 0 && SMX <= 2 && (SMX == 0 || !SHU), "SMX 1 / 2: the per-warp kernel only");

// The B operand of the score MMA (Q^T, k-permuted as load_q_frags builds it):
// in registers, or in shared memory as uint4 {k, k + 1} pairs of one lane
// (index (nh * KSTEPS / 2 + k / 2) * 32 from the lane's first), which frees the
// 16 * NH registers per thread that two blocks of 8 warps per SM need at 16 rows.
#if QSMEM
struct QOp { const uint4* p; };
#else
struct QOp { u32 r[NH][KSTEPS][2]; };
#endif
#define HQ_ (HK * GQ)             // query heads

// Q^T fragments of rows 16 c + 8 nh + g (token-major rows; rows past VR are zeros): k-step k's two words are
// columns 16 k + TS t4 (+ 1) and 16 k + TS t4 + W2 (+ 1). load_q_rows (TS 4, W2 2): k-permuted as in
// load_q_frags; load_q_nat (TS 2, W2 8): natural dim order.
template <int TS, int W2>
static __device__ __forceinline__ void load_q_cols(
    u32 (&qb)[NH][KSTEPS][2], const unsigned short* __restrict__ Q, int b, int hk, int c,
    long long q_st, long long q_sh, int g, int t4)
{
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        const int r = RC * c + 8 * nh + g;
        const bool ok = (8 * nh + g < RC) && r < VR;
        const int rr = ok ? r : 0;
        const int t = rr / GQ, h = rr % GQ;
        const unsigned short* q = Q + (long long)(b * QL + t) * q_st + (long long)(hk * GQ + h) * q_sh + TS * t4;
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) {
            qb[nh][k][0] = load_q2(q + 16 * k, ok);
            qb[nh][k][1] = load_q2(q + 16 * k + W2, ok);
        }
    }
}
static __device__ __forceinline__ void load_q_rows(
    u32 (&qb)[NH][KSTEPS][2], const unsigned short* __restrict__ Q, int b, int hk, int c,
    long long q_st, long long q_sh, int g, int t4)
{
    load_q_cols<4, 2>(qb, Q, b, hk, c, q_st, q_sh, g, t4);
}

#if SMX
static __device__ __forceinline__ u32 ex2_f16x2(u32 x) {
    u32 r;
    asm("ex2.approx.f16x2 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}
static __device__ __forceinline__ u32 e4m3x2_hi_to_f16x2(u32 two) {  // bytes 2, 3 of two
    u32 r;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(r) : "r"(two));
    return r;
}
static __device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// softmax_tile with fewer instructions per score (SMX = 1, 2). Per score: one FFMA x = s * qk_scale - m
// (c holds the raw scores, -inf where masked), one FMNMX into the warp's lazy-rescale test (max x > TAU:
// no branch per column), the exponential (SMX 1: ex2.approx.f32, then one cvt per two scores; SMX 2: one
// cvt per two scores, then ex2.approx.f16x2, which sm_90 runs as two MUFU.EX2.F16 and a PRMT), and per two
// scores one movmatrix and one HMUL2. The row sums l and z leave the FADD / FFMA chains for one MMA per
// n-tile: A = [ones; zero points] (rows 0-7 / 8-15, k = the tile's tokens), B = the unweighted fp16 P
// (movmatrix), so D rows g / g + 8 are l / z of this thread's columns, summed over all 16 tokens in fp32
// (every g lane holds the same sums: write_rows does not reduce them again). P' = P * (scale / s_run) is
// then one HMUL2 per two scores in the B layout, whose tokens are 2 t4, 2 t4 + 1 (+ 8): the scale|zero
// words of those four tokens are read here (tokens past seq_len get 0: stale bytes never reach an MMA).
// scale_o: rescale_state's (scale_o_sp where this warp holds o and sp).
template <bool MASKED, typename ScaleO>
static __device__ __forceinline__ void softmax_tile_mma(
    State& st, float (&c)[NH][4], const u32* stage, int t4, int tok0, int seq_len, float qk_scale,
    u32 (&pb)[NH][2], ScaleO scale_o)
{
    u32 sz[4];  // tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int tau = 2 * t4 + (i & 1) + 8 * (i >> 1);
        sz[i] = stage[tau * (ROWP / 4) + D / 4 + D / 8];
        if (MASKED && tok0 + tau >= seq_len) sz[i] = 0u;  // (unmasked tiles end before seq_len - K)
    }
    float sc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = f16_lo(sz[i]);
    const float smax = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
    float x[NH][4];
    float xm = NEG_INF;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[nh][i] = fmaf(c[nh][i], qk_scale, -st.m[nh][i & 1]);
            xm = fmaxf(xm, x[nh][i]);
        }
    if (__any_sync(0xffffffffu, xm > TAU || smax > st.s_run)) {
        float tmax[NH][2];
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
            tmax[nh][0] = fmaxf(c[nh][0], c[nh][2]) * qk_scale;
            tmax[nh][1] = fmaxf(c[nh][1], c[nh][3]) * qk_scale;
        }
        float sm = smax;
#pragma unroll
        for (int x2 = 4; x2 <= 16; x2 <<= 1)
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                tmax[nh][0] = fmaxf(tmax[nh][0], __shfl_xor_sync(0xffffffffu, tmax[nh][0], x2));
                tmax[nh][1] = fmaxf(tmax[nh][1], __shfl_xor_sync(0xffffffffu, tmax[nh][1], x2));
            }
        sm = fmaxf(sm, __shfl_xor_sync(0xffffffffu, sm, 1));  // the 16 tokens lie on the 4 t4 lanes
        sm = fmaxf(sm, __shfl_xor_sync(0xffffffffu, sm, 2));
        rescale_state(st, tmax, sm, [&](int nh) {
#pragma unroll
            for (int i = 0; i < 4; ++i) x[nh][i] = fmaf(c[nh][i], qk_scale, -st.m[nh][i & 1]);
        }, scale_o);
    }
    const u32 wp0 = pack_f16x2(sc[0] * st.inv_s, sc[1] * st.inv_s);  // scale / s_run of tokens 2 t4, 2 t4 + 1
    const u32 wp1 = pack_f16x2(sc[2] * st.inv_s, sc[3] * st.inv_s);  // and + 8
    const u32 z0 = prmt(sz[0], sz[1], 0x7632u), z1 = prmt(sz[2], sz[3], 0x7632u);  // their zero points
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#if SMX == 2
        const u32 e0 = ex2_f16x2(pack_f16x2(x[nh][0], x[nh][1])), e1 = ex2_f16x2(pack_f16x2(x[nh][2], x[nh][3]));
#else
        const u32 e0 = pack_f16x2(ex2(x[nh][0]), ex2(x[nh][1])), e1 = pack_f16x2(ex2(x[nh][2]), ex2(x[nh][3]));
#endif
        const u32 u0 = movmatrix_t(e0), u1 = movmatrix_t(e1);  // B layout: tokens 2 t4 (+1), + 8; column g
        float lz[4] = {st.l[nh][0], st.l[nh][1], st.z[nh][0], st.z[nh][1]};
        mma(lz, 0x3C003C00u, z0, 0x3C003C00u, z1, u0, u1);
        st.l[nh][0] = lz[0]; st.l[nh][1] = lz[1]; st.z[nh][0] = lz[2]; st.z[nh][1] = lz[3];
        pb[nh][0] = hmul2(u0, wp0);
        pb[nh][1] = hmul2(u1, wp1);
    }
}
#endif

// The causal limit on head pair nh's scores x[nh] ([tok g | col 2t4, tok g | 2t4+1, tok g+8 | 2t4, tok g+8 | 2t4+1],
// tokens tok0 + g and tok0 + g + 8 of the tile): -inf where the token is at or past the column's limit lim[nh][e].
static __device__ __forceinline__ void mask_causal(float (&x)[NH][4], int nh, int tok0, int g, const int (&lim)[NH][2]) {
    const int p0 = tok0 + g, p1 = tok0 + g + 8;
    if (p0 >= lim[nh][0]) x[nh][0] = NEG_INF;
    if (p0 >= lim[nh][1]) x[nh][1] = NEG_INF;
    if (p1 >= lim[nh][0]) x[nh][2] = NEG_INF;
    if (p1 >= lim[nh][1]) x[nh][3] = NEG_INF;
}

// S^T = K Q^T of one tile (c[0]; KCHAIN == 2: even / odd k-steps summed into it), k-step by k-step: each key
// word converted right before its MMAs.
static __device__ __forceinline__ void score_mma(float (&c)[KCHAIN][NH][4], const QOp& q, const u32 (&kw)[2][KSTEPS])
{
#pragma unroll
    for (int x = 0; x < KCHAIN; ++x)
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) c[x][nh][0] = c[x][nh][1] = c[x][nh][2] = c[x][nh][3] = 0.f;
#pragma unroll
    for (int k = 0; k < KSTEPS; k += 2) {
        u32 bq[NH][4];
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
#if QSMEM
            const uint4 v = q.p[(nh * (KSTEPS / 2) + k / 2) * 32];
            bq[nh][0] = v.x; bq[nh][1] = v.y; bq[nh][2] = v.z; bq[nh][3] = v.w;
#else
            bq[nh][0] = q.r[nh][k][0]; bq[nh][1] = q.r[nh][k][1];
            bq[nh][2] = q.r[nh][k + 1][0]; bq[nh][3] = q.r[nh][k + 1][1];
#endif
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            const u32 a0 = e4m3x2_to_f16x2(kw[0][k + kk]), a1 = e4m3x2_to_f16x2(kw[1][k + kk]);
#if SMX  // the upper key bytes through the F2FP's .H1 operand, not a shift first
            const u32 a2 = e4m3x2_hi_to_f16x2(kw[0][k + kk]), a3 = e4m3x2_hi_to_f16x2(kw[1][k + kk]);
#else
            const u32 a2 = e4m3x2_to_f16x2(kw[0][k + kk] >> 16), a3 = e4m3x2_to_f16x2(kw[1][k + kk] >> 16);
#endif
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) mma(c[kk % KCHAIN][nh], a0, a1, a2, a3, bq[nh][2 * kk], bq[nh][2 * kk + 1]);
        }
    }
#if KCHAIN == 2
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[0][nh][i] += c[1][nh][i];
#endif
}

// attend_tile of decode_k8v4.cu with a causal limit per column: token p of the
// tile (absolute position tok0 + row) counts for column (nh, e) only when
// p < lim[nh][e]; rows at or past seq_len (nvalid_abs) may hold stale bytes and
// get scale = zero = 0 so nothing non-finite can reach the accumulators.
template <bool MASKED>
static __device__ __forceinline__ void attend_tile_causal(
    State& st, const QOp& q, const u32* stage, int g, int t4, int tok0,
    int seq_len, const int (&lim)[NH][2], float qk_scale)
{
    u32 kw[2][KSTEPS];
    u32 vw[4][VW];
    u32 sz0, sz1;
    load_frags(stage, g, t4, kw, vw, sz0, sz1);
    if (MASKED) {
        if (tok0 + g >= seq_len) sz0 = 0u;
        if (tok0 + g + 8 >= seq_len) sz1 = 0u;
    }
    const float sc[2] = {f16_lo(sz0), f16_lo(sz1)}, zr[2] = {f16_hi(sz0), f16_hi(sz1)};

    // ---- S^T, k-step by k-step: each key word converted right before its MMAs
    float c[KCHAIN][NH][4];  // KCHAIN independent accumulator chains (even / odd k-steps): shorter MMA chains
    score_mma(c, q, kw);
#if SMX
    if (MASKED) {  // the causal limit on the raw scores (qk_scale > 0): -inf stays -inf through the FFMA
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) mask_causal(c[0], nh, tok0, g, lim);
    }
    u32 pb[NH][2];
    softmax_tile_mma<MASKED>(st, c[0], stage, t4, tok0, seq_len, qk_scale, pb,
                             [&](int nh, int e, float f) { scale_o_sp(st, nh, e, f); });
#else
    float t[NH][4];  // [tok g | col 2t4, tok g | 2t4+1, tok g+8 | 2t4, tok g+8 | 2t4+1]
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 4; ++i) t[nh][i] = c[0][nh][i] * qk_scale;
        if (MASKED) mask_causal(t, nh, tok0, g, lim);
    }

    u32 pb[NH][2];
    softmax_tile(st, t, sc, zr, pb);
#endif

    PV_MMA(st, vw, pb);  // decode_k8v4.cu
}

// This split's normalised partial output and log2-sum-exp for the rows of chunk c; a row that saw no token writes
// zeros and EMPTY_LSE. The two kernels' accumulators hold different dims (SHU_DIMS: write_rows_shu's) and sum l and z
// differently (REDUCE: over the g lanes; not with SMX, where they already are sums over all tokens, the MMA's, the
// same in every g lane). Each branch keeps its own 1/l, row index and MID_L store: with those before the branch (or
// with the stores as a lambda) the SASS of the shared-unpack builds changed (benchmarks/tq_sass_digest.py).
template <bool REDUCE, bool SHU_DIMS>
static __device__ __forceinline__ void write_rows_of(
    const State& st, float* __restrict__ MID_O, float* __restrict__ MID_L,
    int b, int hk, int c, int S, int s, int g, int t4)
{
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float l = st.l[nh][e], z = st.z[nh][e];
            if (REDUCE) {
#pragma unroll
                for (int x = 4; x <= 16; x <<= 1) {
                    l += __shfl_xor_sync(0xffffffffu, l, x);
                    z += __shfl_xor_sync(0xffffffffu, z, x);
                }
            }
            const int rl = 8 * nh + 2 * t4 + e, r = RC * c + rl;
            if (rl >= RC || r >= VR) continue;
            const int tq = r / GQ, h = r % GQ;
            const bool any = l > 0.f;
            if (SHU_DIMS) {  // m-tile j, accumulator e / 2 + e: dims 16 j + g / 16 j + g + 8 of row 8 nh + 2 t4 + e
                const float inv_l = any ? 1.0f / l : 0.f, sr = st.s_run;
                const float off = (g & 1 ? 64.f : 1024.f) * st.sp[nh][e];  // dims 16 j + g (+ 8): g's parity
                const long long row = verify_part_row(b, tq, hk, h, QL, GQ, HQ_, S, s);
                float* o = MID_O + row * D + g;
#pragma unroll
                for (int j = 0; j < NT16; ++j) {
                    o[16 * j] = (sr * (st.o[j][nh][e] - off) + z) * inv_l;
                    o[16 * j + 8] = (sr * (st.o[j][nh][2 + e] - off) + z) * inv_l;
                }
                if (g == 0) MID_L[row] = any ? st.m[nh][e] + __log2f(l) : EMPTY_LSE;
            } else {  // m-tile 4 u + i, row half h <-> dim 8 VWORD(g, u) + 2 i + h
                const float inv_l = any ? 1.0f / l : 0.f, sp = st.sp[nh][e], sr = st.s_run;
                const long long row = verify_part_row(b, tq, hk, h, QL, GQ, HQ_, S, s);
#pragma unroll
                for (int j = 0; j < NT16; j += 2) {
                    float4 v;
                    v.x = (sr * (st.o[j][nh][e] - 1024.f * sp) + z) * inv_l;
                    v.y = (sr * (st.o[j][nh][2 + e] - 64.f * sp) + z) * inv_l;
                    v.z = (sr * (st.o[j + 1][nh][e] - 1024.f * sp) + z) * inv_l;
                    v.w = (sr * (st.o[j + 1][nh][2 + e] - 64.f * sp) + z) * inv_l;
                    *reinterpret_cast<float4*>(MID_O + row * D + 8 * VWORD(g, j / 4) + 2 * (j % 4)) = v;
                }
                if (g == 0) MID_L[row] = any ? st.m[nh][e] + __log2f(l) : EMPTY_LSE;
            }
        }
    }
}

// The per-warp kernel's rows.
static __device__ __forceinline__ void write_rows(
    const State& st, float* __restrict__ MID_O, float* __restrict__ MID_L,
    int b, int hk, int c, int S, int s, int g, int t4)
{
    write_rows_of<!SMX, false>(st, MID_O, MID_L, b, hk, c, S, s, g, t4);
}

// ---------------------------------------------------------------------------
// What both verify kernels (the one-warp-per-head CTA below and the
// shared-unpack CTA, SHU) do before their tile loops: the block's work item,
// the TMA ring of tq_k8v4_decode_page (same stage layout, same barriers) with
// the first STAGES - 1 tiles in flight, the Q operand and the row state.

// Block (request b, split s, KV-head group hg, chunk block cb) from blockIdx.x;
// warp w serves KV head hk (hl in the group) and row chunk c.
struct VerifyBlock {
    int hl, hg, hk, c, s, b, seq_len;
    int t_begin, t_end;  // the split's tiles
    int first_hidden;    // row t sees tokens [0, first_hidden + t)
    int t_mask;          // tiles from t_mask on reach past seq_len - K for some row (or past the end)
};

// False where the split holds no tokens (then the whole block returns).
static __device__ __forceinline__ bool verify_block(VerifyBlock& v, const int* __restrict__ SL, int S, int min_tiles,
                                                    int w)
{
    v.hl = w % HPB;
    const int cb = blockIdx.x % NCHB, bs = blockIdx.x / (NCHB * NHG);
    v.hg = (blockIdx.x / NCHB) % NHG;
    v.hk = v.hg * HPB + v.hl;
    v.c = cb * NCW + w / HPB;
    v.s = bs % S;
    v.b = bs / S;
    v.seq_len = SL[v.b];
    const Split split = split_of(v.seq_len, S, min_tiles);
    const int tiles_per = split.tiles_per;
    if (v.s >= split.n_act) return false;
    v.t_begin = v.s * tiles_per;
    v.t_end = min(v.t_begin + tiles_per, split.n_tiles);
    v.first_hidden = v.seq_len - QL + 1;
    v.t_mask = v.first_hidden > 0 ? v.first_hidden >> 4 : 0;
    return true;
}

struct VerifyRing {
    u32 ring, bars;        // STAGES stages, then full[STAGES] (and empty[STAGES]) mbarriers
    const int* bt_row;
    int pg_next;           // warp 0, lane 0: the page of the next tile to copy
};

// Tile T (page pg) into stage `slot`: the block's head group of 16 token rows (warp 0, all lanes).
static __device__ __forceinline__ void ring_produce(const VerifyRing& r, const VerifyBlock& v,
                                                    const unsigned char* __restrict__ KV, long long kv_sblk,
                                                    int T, int slot, int pg, int lane)
{
    const unsigned char* src = KV + (long long)pg * kv_sblk + (long long)((16 * T) % PAGE) * SP
                               + (HPB < HK ? v.hg * (HPB * HS) : 0);
    const u32 full = r.bars + 8 * slot, dst = r.ring + slot * STAGE_BYTES;
    if (lane == 0) mbar_expect(full, 16 * CB);
    __syncwarp();
#if ROWCOPY
    if (lane < 16) bulk_copy(dst + lane * ROWP, src + lane * SP, CB, full);
#else
    if (lane == 0) bulk_copy(dst, src, 16 * SP, full);
#endif
}

// The barriers (EMPTY: also empty[STAGES], NWB arrivals each) and the copies of
// the split's first STAGES - 1 tiles.
template <bool EMPTY>
static __device__ __forceinline__ void ring_start(VerifyRing& r, const VerifyBlock& v, unsigned char* smem,
                                                  const unsigned char* __restrict__ KV, const int* __restrict__ BT,
                                                  long long bt_sb, long long kv_sblk, int w, int lane)
{
    r.ring = smem_addr(smem);
    r.bars = r.ring + STAGES * STAGE_BYTES;
    r.bt_row = BT + v.b * bt_sb;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(r.bars + 8 * i, 1);
            if (EMPTY) mbar_init(r.bars + 8 * (STAGES + i), NWB);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    int pg_pre = 0;
    if (w == 0 && lane < STAGES - 1) pg_pre = r.bt_row[(16 * min(v.t_begin + lane, v.t_end - 1)) / PAGE];
    __syncthreads();
    if (w == 0) {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            const int pg = __shfl_sync(0xffffffffu, pg_pre, i);
            if (v.t_begin + i < v.t_end) ring_produce(r, v, KV, kv_sblk, v.t_begin + i, i, pg, lane);
        }
    }
    r.pg_next = 0;
    if (w == 0 && lane == 0) r.pg_next = r.bt_row[(16 * min(v.t_begin + STAGES - 1, v.t_end - 1)) / PAGE];
}

// The Q operand of warp w (QSMEM: its fragments moved to shared memory after
// the ring's barriers); load(qb) fills the fragments.
template <typename LoadQ>
static __device__ __forceinline__ void load_qop(QOp& qop, unsigned char* smem, int w, int lane, LoadQ load)
{
#if QSMEM
    uint4* qsm = reinterpret_cast<uint4*>(smem + STAGES * STAGE_BYTES + 16 * STAGES)
                 + w * (NH * (KSTEPS / 2) * 32) + lane;
    u32 qb[NH][KSTEPS][2];
    load(qb);
#pragma unroll
    for (int nh = 0; nh < NH; ++nh)
#pragma unroll
        for (int k = 0; k < KSTEPS; k += 2)
            qsm[(nh * (KSTEPS / 2) + k / 2) * 32] = make_uint4(qb[nh][k][0], qb[nh][k][1], qb[nh][k + 1][0],
                                                               qb[nh][k + 1][1]);
    __syncwarp();
    qop.p = qsm;
#else
    load(qop.r);
#endif
}

// Empty softmax state per row (running max EMPTY_LSE, see the top) and each
// column's causal limit.
static __device__ __forceinline__ void init_rows(State& st, int (&lim)[NH][2], const VerifyBlock& v, int t4)
{
    init_state(st);
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        st.m[nh][0] = st.m[nh][1] = EMPTY_LSE;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = RC * v.c + 8 * nh + 2 * t4 + e;
            lim[nh][e] = r < VR ? v.first_hidden + r / GQ : v.seq_len;
        }
    }
}

// The parameters of both verify kernels (the launch in mtp_verify.py passes them in this order).
#define VERIFY_PARAMS                                                                               \
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,                     \
    const int* __restrict__ BT, const int* __restrict__ SL,                                         \
    float* __restrict__ MID_O, float* __restrict__ MID_L,                                           \
    float qk_scale, int B, int S, int min_tiles,                                                    \
    long long q_st, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead

// The start both verify kernels share: the block's work item (a split with no
// tokens: the whole block returns), the TMA ring with its first STAGES - 1 tiles
// in flight (EMPTY: with the empty barriers), warp w's Q operand (LOAD_Q: the
// fragment loader of the kernel's operand order), its rows' state and causal
// limits, and the names the tile loops use. A macro rather than a function so
// that both kernels keep their exact SASS (benchmarks/tq_sass_digest.py).
#define VERIFY_START(EMPTY, LOAD_Q)                                                                 \
    extern __shared__ __align__(128) unsigned char smem[];                                          \
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;                                        \
    VerifyBlock v;                                                                                  \
    if (!verify_block(v, SL, S, min_tiles, w)) return; /* the whole block */                        \
    const int g = lane >> 2, t4 = lane & 3;                                                         \
    VerifyRing rg;                                                                                  \
    ring_start<EMPTY>(rg, v, smem, KV, BT, bt_sb, kv_sblk, w, lane);                                \
    QOp qop;                                                                                        \
    load_qop(qop, smem, w, lane,                                                                    \
             [&](u32 (&qb)[NH][KSTEPS][2]) { LOAD_Q(qb, Q, v.b, v.hk, v.c, q_st, q_sh, g, t4); }); \
    State st;                                                                                       \
    int lim[NH][2];                                                                                 \
    init_rows(st, lim, v, t4);                                                                      \
    const int hl = v.hl, hk = v.hk, c = v.c, s = v.s, b = v.b, seq_len = v.seq_len;                 \
    const int t_begin = v.t_begin, t_end = v.t_end, t_mask = v.t_mask;                              \
    const u32 bars = rg.bars;                                                                       \
    const int* bt_row = rg.bt_row;                                                                  \
    int pg_next = rg.pg_next;                                                                       \
    auto produce = [&](int T, int slot, int pg) { ring_produce(rg, v, KV, kv_sblk, T, slot, pg, lane); };

#if !SHU && !WSP
// One block per (request, split, row chunk), one warp per KV head; the TMA
// ring of tq_k8v4_decode_page (same stage layout, same barriers).
extern "C" __global__ void __launch_bounds__(NWB * 32, MINB) tq_k8v4_verify_page(VERIFY_PARAMS)
{
    VERIFY_START(true, load_q_rows)

    const unsigned char* my = smem + hl * kv_shead;
    int slot = 0;
    u32 phase = 0;
    u32 empty_phase = 0;
    for (int T = t_begin; T < t_end; ++T) {
        if (w == 0) {
            const int Tn = T + STAGES - 1;
            const int sn = slot == 0 ? STAGES - 1 : slot - 1;
            const int pg = __shfl_sync(0xffffffffu, pg_next, 0);
            if (Tn < t_end) {
                if (T > t_begin) {
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
        if (RING_ONLY) {  // diagnostics only (benchmarks/bench_mtp_verify.py): the ring without the tile math
        } else if (T >= t_mask) attend_tile_causal<true>(st, qop, stage, g, t4, 16 * T, seq_len, lim, qk_scale);
        else attend_tile_causal<false>(st, qop, stage, g, t4, 16 * T, seq_len, lim, qk_scale);
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + slot));
        slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    write_rows(st, MID_O, MID_L, b, hk, c, S, s, g, t4);
}
#endif  // !SHU && !WSP

#if WSP
// ---------------------------------------------------------------------------
// The warp-specialised pair (WSP = 1, VerifyConfig.ws; mtp_verify.block_plan offers it where the wide-warp
// plan runs: 17..32 query rows per KV head, one row chunk, HPB a multiple of 4). The per-warp kernel above
// holds, per KV head, one warp with the scores, the softmax AND the P.V accumulators (about 240 registers:
// 8 warps per SM, each waiting about 5 cycles per instruction, docs/bench-mtp-verify-h200.md). Here each KV
// head has two warps on the same TMA ring:
//
// * the score warp (warps 0 .. HPB - 1, a whole warpgroup or more): key words, S^T = K Q^T, the causal
//   mask and softmax_tile_mma's softmax (state m, l, z, s_run), and hands the tile's P' fragments, and the
//   rescale factors where the tile raised a running max, to its P.V warp through shared memory;
// * the P.V warp (warps HPB .. 2 HPB - 1): value words, the rescale of o and sp by those factors, PV_MMA;
//   at the end the score warp's m, l, z and s_run, then write_rows.
//
// Same operations on the same values as the per-warp kernel with SMX = 1, so the outputs are bitwise
// equal (GPU test). setmaxnreg moves registers from the score warpgroup(s) (WS_SREG) to the P.V ones
// (WS_PREG; WS_SREG + WS_PREG = 2 x the launch's per-thread budget), so that two blocks of 2 HPB warps fit
// an SM: 16 warps per SM for the same 8 KV heads, each tile's score and P.V work overlapped across two
// warps. Built for sm_90a (setmaxnreg). The hand-off: two buffers per KV head, named barriers 1 + j
// ("buffer j full": the score warps arrive, the P.V warps wait) and 3 + j ("buffer j free": the other way
// round, from the third tile on), barrier 5 for the final state; the TMA ring's empty barriers count both
// warps of every head (NWB), so a stage is refilled once the P.V warp has read its value words.
static_assert(!SHU && NCH == 1 && NCW == 1 && SMX == 1 && QSMEM == 1 && ROWCOPY == 1 && HPB % 4 == 0,
              "WSP: the wide one-chunk plan with softmax_tile_mma, Q in shared memory, whole warpgroups per role");
#ifndef WS_SREG
#define WS_SREG 88                // registers per thread of the score warps after setmaxnreg
#endif
#ifndef WS_PREG
#define WS_PREG 168               // and of the P.V warps
#endif
#define XWORDS (4 * NH + 1)       // words per lane and tile: P' (2 NH), rescale factors (2 NH), the rescale flag
#define QAREA (NH * (KSTEPS / 2) * 32 * 16)  // bytes of one warp's Q fragments (load_qop's QSMEM layout)
#define XOFF (STAGES * STAGE_BYTES + 16 * STAGES + HPB * QAREA)  // the hand-off buffers (mtp_verify.smem_bytes)
static_assert(6 * NH + 1 <= QAREA / 128, "the final state fits the score warp's Q area");
static_assert(NH <= 4 && QL <= 16, "score_tile's packed limits: 8 columns of 4 bits");

static __device__ __forceinline__ void bar_sync_n(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void bar_arrive_n(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The hand-off of tile i (buffer i & 1) between a head's score warp and its P.V warp: named barriers 1 + j
// (buffer j full: the score warps arrive, the P.V warps wait) and 3 + j (buffer j free, from the third tile on), 5
// (the final state), each counting every warp of the block. (Per-head mbarriers instead, so that the heads of a
// block do not wait for each other, were measured: faster in 5 of the 12 cells with 24 or 32 rows, slower in 7,
// 8-16 bytes of stack; not kept: docs/bench-mtp-verify-h200.md.)
struct HandOff {
    __device__ __forceinline__ void wait_free(int i) const { bar_sync_n(3 + (i & 1), NWB * 32); }  // score, i >= 2
    __device__ __forceinline__ void full(int i) const { bar_arrive_n(1 + (i & 1), NWB * 32); }  // score, after stores
    __device__ __forceinline__ void wait_full(int i) const { bar_sync_n(1 + (i & 1), NWB * 32); }  // P.V
    __device__ __forceinline__ void free(int i, int n) const {  // P.V, after its loads (the last two: never waited for)
        if (i < n - 2) bar_arrive_n(3 + (i & 1), NWB * 32);
    }
    __device__ __forceinline__ void final_done() const { bar_arrive_n(5, NWB * 32); }
    __device__ __forceinline__ void final_wait() const { bar_sync_n(5, NWB * 32); }
};

// The score half of attend_tile_causal (SMX 1): P' of the tile into pb; a rescale hands each column's factor to
// scale_o instead of scaling o and sp, which this warp does not hold. The causal limits come packed (lim4: column
// (nh, e)'s limit less first_hidden in bits 8 nh + 4 e: at most QL - 1), two registers instead of init_rows' 8,
// which the score warps' register budget has no room for.
template <bool MASKED, typename ScaleO>
static __device__ __forceinline__ void score_tile(
    State& st, const QOp& q, const u32* stage, int g, int t4, int tok0, int seq_len, u32 lim4, int first_hidden,
    float qk_scale, u32 (&pb)[NH][2], ScaleO scale_o)
{
    u32 kw[2][KSTEPS];
    load_kw(stage, g, t4, kw);
    float c[KCHAIN][NH][4];
    score_mma(c, q, kw);
    if (MASKED) {
        asm volatile("" : "+r"(lim4));  // (decoded here: hoisted out of the tile loop, the 8 limits spill)
        int lim[NH][2];
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int e = 0; e < 2; ++e) lim[nh][e] = first_hidden + (int)((lim4 >> (8 * nh + 4 * e)) & 15u);
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) mask_causal(c[0], nh, tok0, g, lim);
    }
    softmax_tile_mma<MASKED>(st, c[0], stage, t4, tok0, seq_len, qk_scale, pb, scale_o);
}

extern "C" __global__ void __launch_bounds__(NWB * 32, MINB) tq_k8v4_verify_page(VERIFY_PARAMS)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, hl = w % HPB;
    VerifyBlock v;
    if (!verify_block(v, SL, S, min_tiles, hl)) return;  // (the whole block)
    const int g = lane >> 2, t4 = lane & 3;
    const HandOff ho;
    VerifyRing rg;
    ring_start<true>(rg, v, smem, KV, BT, bt_sb, kv_sblk, w, lane);
    const u32 bars = rg.bars;
    const unsigned char* my = smem + hl * kv_shead;  // this head's slot in row 0 of a stage
    u32* xh = reinterpret_cast<u32*>(smem + XOFF) + hl * (2 * XWORDS * 32) + lane;  // buffer j: + j * XWORDS * 32
    float* fin = reinterpret_cast<float*>(smem + STAGES * STAGE_BYTES + 16 * STAGES + hl * QAREA) + lane;
    const int n = v.t_end - v.t_begin;
    int slot = 0;
    u32 phase = 0;
    if (w < HPB) {
        QOp qop;  // (its 16 NH fragment registers before setmaxnreg: the P.V warps' setmaxnreg.inc waits for it)
        load_qop(qop, smem, w, lane, [&](u32 (&qb)[NH][KSTEPS][2]) {
            load_q_rows(qb, Q, v.b, v.hk, v.c, q_st, q_sh, g, t4);
        });
        State st;
        u32 lim4 = 0;  // the causal limits of the thread's 8 columns, less first_hidden, 4 bits each (score_tile)
        {
            int lim[NH][2];
            init_rows(st, lim, v, t4);
#pragma unroll
            for (int nh = 0; nh < NH; ++nh)
#pragma unroll
                for (int e = 0; e < 2; ++e) lim4 |= (u32)(lim[nh][e] - v.first_hidden) << (8 * nh + 4 * e);
        }
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_SREG));
        int pg_next = rg.pg_next;
        u32 empty_phase = 0;
        for (int T = v.t_begin; T < v.t_end; ++T) {
            const int i = T - v.t_begin;
            if (w == 0) {  // refill the stage freed by tile T - 1 with tile T + STAGES - 1
                const int Tn = T + STAGES - 1;
                const int sn = slot == 0 ? STAGES - 1 : slot - 1;
                const int pg = __shfl_sync(0xffffffffu, pg_next, 0);
                if (Tn < v.t_end) {
                    if (T > v.t_begin) {
                        mbar_wait(bars + 8 * (STAGES + sn), (empty_phase >> sn) & 1);
                        empty_phase ^= 1u << sn;
                    }
                    ring_produce(rg, v, KV, kv_sblk, Tn, sn, pg, lane);
                    if (lane == 0) pg_next = rg.bt_row[(16 * min(Tn + 1, v.t_end - 1)) / PAGE];
                }
            }
            mbar_wait(bars + 8 * slot, (phase >> slot) & 1);
            phase ^= 1u << slot;
            const u32* stage = reinterpret_cast<const u32*>(my + slot * STAGE_BYTES);
            u32* x = xh + (i & 1) * (XWORDS * 32);
            if (i >= 2) ho.wait_free(i);  // the P.V warp has read this buffer's tile i - 2
            u32 pb[NH][2];
            bool resc = false;  // (warp-uniform: the softmax's vote) the factors go straight to the buffer
            auto hand = [&](int nh, int e, float f) { x[(2 * NH + 2 * nh + e) * 32] = __float_as_uint(f); resc = true; };
            if (T >= v.t_mask)
                score_tile<true>(st, qop, stage, g, t4, 16 * T, v.seq_len, lim4, v.first_hidden, qk_scale, pb, hand);
            else score_tile<false>(st, qop, stage, g, t4, 16 * T, v.seq_len, lim4, v.first_hidden, qk_scale, pb, hand);
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8 * (STAGES + slot));
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                x[(2 * nh) * 32] = pb[nh][0];
                x[(2 * nh + 1) * 32] = pb[nh][1];
            }
            x[4 * NH * 32] = resc ? 1u : 0u;
            ho.full(i);
            slot = slot + 1 == STAGES ? 0 : slot + 1;
        }
        __syncwarp();  // every lane is done with its Q fragments: the area takes the final state
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                fin[(2 * nh + e) * 32] = st.m[nh][e];
                fin[(2 * NH + 2 * nh + e) * 32] = st.l[nh][e];
                fin[(4 * NH + 2 * nh + e) * 32] = st.z[nh][e];
            }
        fin[6 * NH * 32] = st.s_run;
        ho.final_done();
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_PREG));
        State st;
        init_state(st);
        for (int T = v.t_begin; T < v.t_end; ++T) {
            const int i = T - v.t_begin;
            mbar_wait(bars + 8 * slot, (phase >> slot) & 1);
            phase ^= 1u << slot;
            u32 vw[4][VW];
            load_vw(reinterpret_cast<const u32*>(my + slot * STAGE_BYTES), g, t4, vw);
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8 * (STAGES + slot));
            const u32* x = xh + (i & 1) * (XWORDS * 32);
            ho.wait_full(i);  // the score warp has written tile i
            u32 pb[NH][2];
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) {
                pb[nh][0] = x[(2 * nh) * 32];
                pb[nh][1] = x[(2 * nh + 1) * 32];
            }
            if (x[4 * NH * 32]) {
#pragma unroll
                for (int nh = 0; nh < NH; ++nh)
#pragma unroll
                    for (int e = 0; e < 2; ++e) scale_o_sp(st, nh, e, __uint_as_float(x[(2 * NH + 2 * nh + e) * 32]));
            }
            ho.free(i, n);  // buffer free for tile i + 2
            PV_MMA(st, vw, pb);
            slot = slot + 1 == STAGES ? 0 : slot + 1;
        }
        ho.final_wait();  // the score warp's final state is in its Q area
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                st.m[nh][e] = fin[(2 * nh + e) * 32];
                st.l[nh][e] = fin[(2 * NH + 2 * nh + e) * 32];
                st.z[nh][e] = fin[(4 * NH + 2 * nh + e) * 32];
            }
        st.s_run = fin[6 * NH * 32];
        write_rows(st, MID_O, MID_L, v.b, v.hk, v.c, S, v.s, g, t4);
    }
}
#endif  // WSP

#if SHU
// ---------------------------------------------------------------------------
// The shared-unpack CTA (SHU = 1, chosen by mtp_verify.block_plan where G (K + 1) > 16 rows per KV head):
// the same blocks as above (HPB KV heads x NCW row-chunk warps on one TMA ring), but the warps of a block
// unpack each copied tile ONCE, together, into an f16 tile in shared memory (UBUF = 1 or 2 of them; per KV
// head: keys [16][D] as fp16 (e4m3 -> f16 is exact), value codes [16][D] as fp16 1024 + code / 64 + code
// (exact), the 16 scale|zero words), and every row-chunk warp reads its MMA A fragments from it with
// ldmatrix. A warp's share of the fp8 / 4-bit unpacking drops by NCW; its per-tile chain is ldmatrix + MMA
// + softmax.
//
// * S^T = K Q^T: A = the f16 key tile (ldmatrix.x4, natural dim order), B = Q^T in registers (natural
//   order: b0 = dims 16 k + 2 t4 + {0, 1}, b1 = dims 16 k + 8 + 2 t4 + {0, 1} of row 8 nh + g).
// * O^T += V^T P^T: A = the f16 code tile transposed by ldmatrix.x4.trans (m-tile j = dims 16 j..16 j + 15),
//   B = P' = p * scale / s_run (fp16, movmatrix), and the ones-MMA that removes the code offsets, as in the
//   kernels above. value = zero + scale * code: the zero is the rank-one term z (fp32).
// * UBUF = 2: one __syncthreads per tile: tile T is unpacked into buffer T & 1; a warp that passed the barrier of
//   tile T has finished tile T - 1, so buffer (T + 1) & 1 and the raw stage of tile T - 1 (refilled by
//   warp 0 at the top of the next iteration) are free. The raw ring needs only the full barriers.
//   UBUF = 1: a second __syncthreads after the tile's MMAs (half the shared memory).
// * Rows of the last tile past seq_len hold stale bytes (NaN keys): their scores are set to -inf and their
//   scale|zero to 0 before they can reach an accumulator; codes are always finite.
#define UP ((D + 8) * 2)          // bytes per unpacked token row: + 16 bytes, so the 8 rows an ldmatrix reads hit 8 bank quads
#define UHEAD (32 * UP + 64)      // one KV head's unpacked tile: keys [16][UP], codes [16][UP], scale|zero [16] words
#ifndef UBUF
#define UBUF 2                    // unpacked tiles: 2 (one barrier per tile) or 1 (two barriers per tile)
#endif
static_assert(UBUF == 1 || UBUF == 2, "one or two unpacked tiles");
#define QBYTES (QSMEM ? NWB * NH * (KSTEPS / 2) * 32 * 16 : 0)  // Q fragments of all warps (QSMEM = 1)
#ifndef UNR
#define UNR 2                     // unpack loop unrolling (more spills at 8 warps a block)
#endif
#define UOFF ((STAGES * STAGE_BYTES + 16 * STAGES + QBYTES + 127) / 128 * 128)
static_assert(D <= 128, "the shared-unpack CTA holds D / 16 x 2 x 4 accumulators per thread (D <= 128)");
static_assert(RC == 16 || NCH == 1, "16-row warps");

static __device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Q^T fragments in natural dim order (load_q_cols; rows past VR are zeros).
static __device__ __forceinline__ void load_q_nat(
    u32 (&qb)[NH][KSTEPS][2], const unsigned short* __restrict__ Q, int b, int hk, int c,
    long long q_st, long long q_sh, int g, int t4)
{
    load_q_cols<2, 8>(qb, Q, b, hk, c, q_st, q_sh, g, t4);
}

// The block's share of unpacking one raw stage (HPB heads' slots of 16 token rows) into an unpacked buffer.
// A warp converts a pair of token rows of one head at a time: key word i of the pair on lane i % 32
// (D / 4 words a row), value word lane (2 rows x D / 8 words), the two scale|zero words. NWB a multiple of
// 8: warp w takes rows 2 (w % 8), + 1 of heads w / 8, w / 8 + NWB / 8, ... (fixed addresses plus a stride);
// otherwise pair p = w + it NWB is rows 2 p % 16, + 1 of head p / 8.
// Codes are stored as in the MMA fragments of the kernels above: fp16 1024 + code for a low nibble (even
// dim), 64 + code for a high one (odd dim), one prmt + one lop3 per pair of dims; the offsets leave through
// the ones-MMA (sp) at the end, as there.
static __device__ __forceinline__ void unpack_pair(const unsigned char* r, unsigned char* u, unsigned char* szu,
                                                   int lane)
{
    constexpr int KWD = D / 4, VWD = D / 8;  // key / value-code words per token
    static_assert((2 * KWD) % 32 == 0 && 2 * VWD <= 32, "whole rows per warp");
#pragma unroll
    for (int i = 0; i < 2 * KWD / 32; ++i) {
        const int wi = lane + 32 * i, rr = wi / KWD, wd = wi % KWD;
        const u32 x = *reinterpret_cast<const u32*>(r + rr * ROWP + 4 * wd);
        uint2 y;
        y.x = e4m3x2_to_f16x2(x);
        y.y = e4m3x2_to_f16x2(x >> 16);
        *reinterpret_cast<uint2*>(u + rr * UP + 8 * wd) = y;
    }
    if (2 * VWD == 32 || lane < 2 * VWD) {
        const int rr = lane / VWD, wd = lane % VWD;
        const u32 x = *reinterpret_cast<const u32*>(r + rr * ROWP + D + 4 * wd);
        // byte j = dims 8 wd + 2 j (low nibble) and + 1 (high nibble)
        uint4 y;
        y.x = (prmt(x, 0u, 0x4040u) & 0x00F0000Fu) | 0x54006400u;
        y.y = (prmt(x, 0u, 0x4141u) & 0x00F0000Fu) | 0x54006400u;
        y.z = (prmt(x, 0u, 0x4242u) & 0x00F0000Fu) | 0x54006400u;
        y.w = (prmt(x, 0u, 0x4343u) & 0x00F0000Fu) | 0x54006400u;
        *reinterpret_cast<uint4*>(u + 16 * UP + rr * UP + 16 * wd) = y;
        if (wd == 0) *reinterpret_cast<u32*>(szu + 4 * rr) = *reinterpret_cast<const u32*>(r + rr * ROWP + D + D / 2);
    }
}

static __device__ __forceinline__ void unpack_tile(const unsigned char* raw, unsigned char* ub, int w, int lane,
                                                   int kv_shead)
{
#if NWB % 8 == 0
    const int tp = w & 7, h0 = w >> 3;
    const unsigned char* r = raw + (2 * tp) * ROWP + h0 * kv_shead;
    unsigned char* u = ub + h0 * UHEAD + (2 * tp) * UP;
#pragma unroll UNR
    for (int it = 0; it < HPB * 8 / NWB; ++it)
        unpack_pair(r + it * (NWB / 8) * kv_shead, u + it * (NWB / 8) * UHEAD,
                    u + it * (NWB / 8) * UHEAD + (32 - 2 * tp) * UP + 8 * tp, lane);
#else
#pragma unroll 1
    for (int it = 0; it < (HPB * 8 + NWB - 1) / NWB; ++it) {
        const int p = w + it * NWB;
        if (p < HPB * 8) {
            const int h = p >> 3, tau = (2 * p) & 15;
            unpack_pair(raw + tau * ROWP + h * kv_shead, ub + h * UHEAD + tau * UP,
                        ub + h * UHEAD + 32 * UP + 4 * tau, lane);
        }
    }
#endif
}

// One tile from the unpacked buffer of this warp's KV head: ka / va = this lane's ldmatrix row addresses
// (k-step / m-tile 0), szw = the tile's scale|zero words.
template <bool MASKED>
static __device__ __forceinline__ void attend_tile_shu(
    State& st, const QOp& q, u32 ka, u32 va, const u32* szw, int g, int tok0,
    int seq_len, const int (&lim)[NH][2], float qk_scale)
{
    u32 sz0 = szw[g], sz1 = szw[g + 8];
    if (MASKED) {
        if (tok0 + g >= seq_len) sz0 = 0u;
        if (tok0 + g + 8 >= seq_len) sz1 = 0u;
    }
    const float sc[2] = {f16_lo(sz0), f16_lo(sz1)}, zr[2] = {f16_hi(sz0), f16_hi(sz1)};

    float c[NH][4];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) c[nh][0] = c[nh][1] = c[nh][2] = c[nh][3] = 0.f;
#pragma unroll
    for (int k = 0; k < KSTEPS; k += 2) {
        u32 bq[NH][4];
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
#if QSMEM
            const uint4 v = q.p[(nh * (KSTEPS / 2) + k / 2) * 32];
            bq[nh][0] = v.x; bq[nh][1] = v.y; bq[nh][2] = v.z; bq[nh][3] = v.w;
#else
            bq[nh][0] = q.r[nh][k][0]; bq[nh][1] = q.r[nh][k][1];
            bq[nh][2] = q.r[nh][k + 1][0]; bq[nh][3] = q.r[nh][k + 1][1];
#endif
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            u32 a[4];
            ldsm_x4(a, ka + 32 * (k + kk));
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) mma(c[nh], a[0], a[1], a[2], a[3], bq[nh][2 * kk], bq[nh][2 * kk + 1]);
        }
    }
    float t[NH][4];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 4; ++i) t[nh][i] = c[nh][i] * qk_scale;
        if (MASKED) mask_causal(t, nh, tok0, g, lim);
    }
    u32 pb[NH][2];
    softmax_tile(st, t, sc, zr, pb);
#pragma unroll
    for (int j = 0; j < NT16; ++j) {
        u32 a[4];
        ldsm_x4_t(a, va + 32 * j);
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) mma(st.o[j][nh], a[0], a[1], a[2], a[3], pb[nh][0], pb[nh][1]);
    }
    sum_p(st, pb);  // decode_k8v4.cu: the sum of the fp16 P' the MMAs saw, which removes the code offsets
}

// The shared-unpack kernel's rows (write_rows_of).
static __device__ __forceinline__ void write_rows_shu(
    const State& st, float* __restrict__ MID_O, float* __restrict__ MID_L,
    int b, int hk, int c, int S, int s, int g, int t4)
{
    write_rows_of<true, true>(st, MID_O, MID_L, b, hk, c, S, s, g, t4);
}

extern "C" __global__ void __launch_bounds__(NWB * 32, MINB) tq_k8v4_verify_page(VERIFY_PARAMS)
{
    VERIFY_START(false, load_q_nat)  // full barriers only: see the loop

    // this lane's ldmatrix rows: keys (x4: tokens 0-7 | 8-15 x dims 0-7 | 8-15 of a k-step), codes (x4.trans:
    // tokens 0-7 x dims 0-7 | 8-15, then tokens 8-15 x dims 0-7 | 8-15 of an m-tile)
    const int lr = lane & 7, lm = lane >> 3;
    const u32 k_lane = (u32)((lr + 8 * (lm & 1)) * UP + 16 * (lm >> 1));
    const u32 v_lane = (u32)(16 * UP + (lr + 8 * (lm >> 1)) * UP + 16 * (lm & 1));
    unsigned char* ubase = smem + UOFF;
    const u32 ubase_a = smem_addr(ubase) + hl * UHEAD;
    int slot = 0, ub = 0;
    u32 phase = 0;
    for (int T = t_begin; T < t_end; ++T) {
        if (w == 0) {  // the stage of tile T - 1 was unpacked before the last barrier: refill it
            const int Tn = T + STAGES - 1;
            const int sn = slot == 0 ? STAGES - 1 : slot - 1;
            const int pg = __shfl_sync(0xffffffffu, pg_next, 0);
            if (Tn < t_end) {
                produce(Tn, sn, pg);
                if (lane == 0) pg_next = bt_row[(16 * min(Tn + 1, t_end - 1)) / PAGE];
            }
        }
        mbar_wait(bars + 8 * slot, (phase >> slot) & 1);
        phase ^= 1u << slot;
        unpack_tile(smem + slot * STAGE_BYTES, ubase + ub * (HPB * UHEAD), w, lane, (int)kv_shead);
        __syncthreads();  // the unpacked tile is complete (and, UBUF = 2, everyone is done with tile T - 1)
        const u32 hb = ubase_a + ub * (HPB * UHEAD);
        const u32* szw = reinterpret_cast<const u32*>(ubase + ub * (HPB * UHEAD) + hl * UHEAD + 32 * UP);
        if (T >= t_mask) attend_tile_shu<true>(st, qop, hb + k_lane, hb + v_lane, szw, g, 16 * T, seq_len, lim, qk_scale);
        else attend_tile_shu<false>(st, qop, hb + k_lane, hb + v_lane, szw, g, 16 * T, seq_len, lim, qk_scale);
#if UBUF == 2
        ub ^= 1;
#else
        __syncthreads();  // one unpacked tile: everyone is done with it before the next unpack
#endif
        slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    write_rows_shu(st, MID_O, MID_L, b, hk, c, S, s, g, t4);
}
#endif  // SHU
