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
//   RC   rows per warp (min(QL * GQ, 16)); decode_k8v4.cu's G, so NH = ceil(RC / 8)
//   NCH  row chunks: ceil(QL * GQ / RC).
//   HPB  KV heads per block (divides HK); HPB < HK copies only those heads'
//        bytes of each token row (CB bytes from byte HS * HPB * group)
//   NCW  chunk warps per KV head in a block (the shared-tile CTA)
//   NCHB chunk blocks: ceil(NCH / NCW)
//   CB   bytes of a token row one block copies (SP when HPB == HK)
//   HS   bytes between the slots of two KV heads in a row (cache stride 2)
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
#define NWB (HPB * NCW)           // warps per block
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

// The B operand of the score MMA (Q^T, k-permuted as load_q_frags builds it):
// in registers, or in shared memory as uint4 {k, k + 1} pairs of one lane
// (index (nh * KSTEPS / 2 + k / 2) * 32 from the lane's first), which frees the
// 16 * NH registers per thread that two blocks of 8 warps per SM need at 16 rows.
#if QSMEM
struct QOp { const uint4* p; };
#else
struct QOp { u32 r[NH][KSTEPS][2]; };
#endif
#define EMPTY_LSE (-1e30f)
#define HQ_ (HK * GQ)             // query heads

// Q^T fragments of rows 16 c + 8 nh + g (token-major rows), k-permuted as in
// load_q_frags; rows past VR are zeros.
static __device__ __forceinline__ void load_q_rows(
    u32 (&qb)[NH][KSTEPS][2], const unsigned short* __restrict__ Q, int b, int hk, int c,
    long long q_st, long long q_sh, int g, int t4)
{
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        const int r = RC * c + 8 * nh + g;
        const bool ok = (8 * nh + g < RC) && r < VR;
        const int rr = ok ? r : 0;
        const int t = rr / GQ, h = rr % GQ;
        const unsigned short* q = Q + (long long)(b * QL + t) * q_st + (long long)(hk * GQ + h) * q_sh + 4 * t4;
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) {
            qb[nh][k][0] = load_q2(q + 16 * k, ok);
            qb[nh][k][1] = load_q2(q + 16 * k + 2, ok);
        }
    }
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
            const u32 a2 = e4m3x2_to_f16x2(kw[0][k + kk] >> 16), a3 = e4m3x2_to_f16x2(kw[1][k + kk] >> 16);
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
    float t[NH][4];  // [tok g | col 2t4, tok g | 2t4+1, tok g+8 | 2t4, tok g+8 | 2t4+1]
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 4; ++i) t[nh][i] = c[0][nh][i] * qk_scale;
        if (MASKED) {
            const int p0 = tok0 + g, p1 = tok0 + g + 8;
            if (p0 >= lim[nh][0]) t[nh][0] = NEG_INF;
            if (p0 >= lim[nh][1]) t[nh][1] = NEG_INF;
            if (p1 >= lim[nh][0]) t[nh][2] = NEG_INF;
            if (p1 >= lim[nh][1]) t[nh][3] = NEG_INF;
        }
    }

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
        const float s_new = fmaxf(st.s_run, smax);
        const float ratio = st.s_run / s_new;
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float m_new = fmaxf(st.m[nh][e], tmax[nh][e]);  // stays >= -1e30: never -inf
                const float alpha = ex2(st.m[nh][e] - m_new);
                const float f = alpha * ratio;
#pragma unroll
                for (int j = 0; j < NT16; ++j) { st.o[j][nh][e] *= f; st.o[j][nh][2 + e] *= f; }
                st.sp[nh][e] *= f;
                st.l[nh][e] *= alpha; st.z[nh][e] *= alpha;
                st.m[nh][e] = m_new;
            }
        }
        st.s_run = s_new;
        st.inv_s = 1.0f / s_new;
    }

    const float w0 = sc[0] * st.inv_s, w1 = sc[1] * st.inv_s;
    u32 pb[NH][2];
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

#pragma unroll
    for (int u = 0; u < VW; ++u) {
        u32 x[2][4];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            u32 a = vw[2 * hh][u], b = vw[2 * hh + 1][u];
            u32 lo = prmt(a, b, 0x5410u);
            u32 hi = prmt(a, b, 0x7632u);
            x[hh][0] = lo; x[hh][1] = lo >> 8; x[hh][2] = hi; x[hh][3] = hi >> 8;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 a0 = (x[0][i] & 0x000F000Fu) | 0x64006400u;
            const u32 a1 = (x[0][i] & 0x00F000F0u) | 0x54005400u;
            const u32 a2 = (x[1][i] & 0x000F000Fu) | 0x64006400u;
            const u32 a3 = (x[1][i] & 0x00F000F0u) | 0x54005400u;
#pragma unroll
            for (int nh = 0; nh < NH; ++nh) mma(st.o[4 * u + i][nh], a0, a1, a2, a3, pb[nh][0], pb[nh][1]);
        }
    }
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        float c[4] = {st.sp[nh][0], st.sp[nh][1], 0.f, 0.f};
        mma(c, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u, pb[nh][0], pb[nh][1]);
        st.sp[nh][0] = c[0]; st.sp[nh][1] = c[1];
    }
}

// This split's normalised partial output and log2-sum-exp for the rows of
// chunk c; a row that saw no token writes zeros and EMPTY_LSE.
static __device__ __forceinline__ void write_rows(
    const State& st, float* __restrict__ MID_O, float* __restrict__ MID_L,
    int b, int hk, int c, int S, int s, int g, int t4)
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
            const int rl = 8 * nh + 2 * t4 + e, r = RC * c + rl;
            if (rl >= RC || r >= VR) continue;
            const int tq = r / GQ, h = r % GQ;
            const bool any = l > 0.f;
            const float inv_l = any ? 1.0f / l : 0.f, sp = st.sp[nh][e], sr = st.s_run;
            const long long row = ((long long)b * (QL * HQ_) + tq * HQ_ + hk * GQ + h) * S + s;
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

// One block per (request, split, row chunk), one warp per KV head; the TMA
// ring of tq_k8v4_decode_page (same stage layout, same barriers).
extern "C" __global__ void __launch_bounds__(NWB * 32, MINB) tq_k8v4_verify_page(
    const unsigned short* __restrict__ Q, const unsigned char* __restrict__ KV,
    const int* __restrict__ BT, const int* __restrict__ SL,
    float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int B, int S, int min_tiles,
    long long q_st, long long q_sh, long long bt_sb, long long kv_sblk, long long kv_shead)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int hl = w % HPB;                         // KV head within the block's group
    const int cb = blockIdx.x % NCHB, hg = (blockIdx.x / NCHB) % NHG, bs = blockIdx.x / (NCHB * NHG);
    const int hk = hg * HPB + hl, c = cb * NCW + w / HPB;
    const int s = bs % S, b = bs / S;
    const int seq_len = SL[b];
    const Split split = split_of(seq_len, S, min_tiles);
    const int tiles_per = split.tiles_per;
    if (s >= split.n_act) return;  // the whole block
    const int t_begin = s * tiles_per;
    const int t_end = min(t_begin + tiles_per, split.n_tiles);
    // tiles from t_mask on reach past seq_len - K for some row (or past the end)
    const int first_hidden = seq_len - QL + 1;  // row t sees [0, first_hidden + t)
    const int t_mask = first_hidden > 0 ? first_hidden >> 4 : 0;
    const int g = lane >> 2, t4 = lane & 3;

    const u32 ring = smem_addr(smem);
    const u32 bars = ring + STAGES * STAGE_BYTES;
    const int* bt_row = BT + b * bt_sb;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < STAGES; ++i) { mbar_init(bars + 8 * i, 1); mbar_init(bars + 8 * (STAGES + i), NWB); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    int pg_pre = 0;
    if (w == 0 && lane < STAGES - 1) pg_pre = bt_row[(16 * min(t_begin + lane, t_end - 1)) / PAGE];
    __syncthreads();

    auto produce = [&](int T, int slot, int pg) {
        const unsigned char* src = KV + (long long)pg * kv_sblk + (long long)((16 * T) % PAGE) * SP
                                   + (HPB < HK ? hg * (HPB * HS) : 0);
        const u32 full = bars + 8 * slot, dst = ring + slot * STAGE_BYTES;
        if (lane == 0) mbar_expect(full, 16 * CB);
        __syncwarp();
#if ROWCOPY
        if (lane < 16) bulk_copy(dst + lane * ROWP, src + lane * SP, CB, full);
#else
        if (lane == 0) bulk_copy(dst, src, 16 * SP, full);
#endif
    };

    if (w == 0) {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            const int pg = __shfl_sync(0xffffffffu, pg_pre, i);
            if (t_begin + i < t_end) produce(t_begin + i, i, pg);
        }
    }
    int pg_next = 0;
    if (w == 0 && lane == 0) pg_next = bt_row[(16 * min(t_begin + STAGES - 1, t_end - 1)) / PAGE];

    QOp qop;
#if QSMEM
    {
        uint4* qsm = reinterpret_cast<uint4*>(smem + STAGES * STAGE_BYTES + 16 * STAGES)
                     + w * (NH * (KSTEPS / 2) * 32) + lane;
        u32 qb[NH][KSTEPS][2];
        load_q_rows(qb, Q, b, hk, c, q_st, q_sh, g, t4);
#pragma unroll
        for (int nh = 0; nh < NH; ++nh)
#pragma unroll
            for (int k = 0; k < KSTEPS; k += 2)
                qsm[(nh * (KSTEPS / 2) + k / 2) * 32] = make_uint4(qb[nh][k][0], qb[nh][k][1], qb[nh][k + 1][0],
                                                                   qb[nh][k + 1][1]);
        __syncwarp();
        qop.p = qsm;
    }
#else
    load_q_rows(qop.r, Q, b, hk, c, q_st, q_sh, g, t4);
#endif
    State st;
    init_state(st);
    int lim[NH][2];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
        st.m[nh][0] = st.m[nh][1] = EMPTY_LSE;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = RC * c + 8 * nh + 2 * t4 + e;
            lim[nh][e] = r < VR ? first_hidden + r / GQ : seq_len;
        }
    }

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
        if (T >= t_mask) attend_tile_causal<true>(st, qop, stage, g, t4, 16 * T, seq_len, lim, qk_scale);
        else attend_tile_causal<false>(st, qop, stage, g, t4, 16 * T, seq_len, lim, qk_scale);
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + slot));
        slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    write_rows(st, MID_O, MID_L, b, hk, c, S, s, g, t4);
}
