// TurboQuant k8v4 speculative verify, transposed (sm_90a, WTR = 1): the keys and values are unpacked straight into
// the registers of the warps that multiply them, so no f16 operand of the cache ever passes through shared memory.
//
// Compiled after decode_k8v4.cu, the wgmma wrappers and verify_wgmma.cu (verify_wg.py concatenates them), whose
// helpers it uses: wg_mma, the tensor map and its copies (wg_produce), the descriptors, wg_block, the nibble unpack
// (wg_unpack2), q_value. The splits it writes are merged by decode_k8v4.cu's merges, in verify_k8v4.cu's layout.
// Opt-in (WgConfig.transposed), not routed: it measured slower than tq_k8v4_verify_ws in 19 of 20 probe cells
// (docs/bench-mtp-verify-h200.md, round 10), with half that kernel's shared-memory traffic.
//
// tq_k8v4_verify_tr: one warpgroup a block, a block per (request b, split s, KV head hk). Both products are
// transposed, so that the cache is always the register (A) operand and the query rows are N:
// * S^T (64 tokens x TR_N rows) = K (A: registers) . Q^T (B: shared, K-major, 128-byte swizzle, written once).
//   Warp w takes tile w of a 64-token stage: thread (g, t4) holds tokens g and g + 8. Its key words are words
//   4 x + t4 (x = 0..7) of the token's row: a warp's load touches 32 banks (token rows are 52 words apart), and
//   k16 step x of the A operand holds dims 16 x + 4 t4 + {0, 1} (c = 2 t4, + 1) and {2, 3} (c = 2 t4 + 8, + 9),
//   the permutation Q^T is written in (tr_qt). e4m3 -> f16 is exact.
// * Softmax per query row (a column), in registers: each thread holds columns 8 i + 2 t4 + {0, 1} of its two
//   tokens. The running max of a column is the warpgroup's (every token of a P.V k-step must share it): lazy, as
//   in the other kernels, raised only when a score exceeds it by TAU. On the common path P is written with the
//   current max and one barrier both publishes P and ORs the "raise" votes; a raise (the block's first stage,
//   then rarely) exchanges the warps' column maxima through shared memory and rewrites P.
// * O^T (128 dims x TR_N rows) += V^T (A: registers) . P^T (B: shared, f16, MN-major, no swizzle), two m64
//   tiles of dims, four k16 steps (tiles) a stage. Thread (w, g) holds code quad q = 8 w + g of every token, dims
//   4 q .. 4 q + 3: dim 4 q + 2 mt + e is M-row 16 w + g + 8 e of tile mt. Its token pairs (2 t4, + 1) and
//   (2 t4 + 8, + 9) are joined by one prmt and unpacked as code * scale + zero (wg_unpack2, one fused rounding).
// * The stage's copy is free once its words are in registers: the same barrier releases it (warp 0 refills it
//   after issuing the O^T, which waits for all four warps).
// * Two hazards the H200 showed: a warp's wgmma wait covers only its own rows while every warp's rows of the O^T
//   read all of P^T (P^T is double-buffered by stage), and ptxas gives an in-flight wgmma's A registers to later
//   values (each stage starts by waiting for the previous O^T; the keys are held to the S^T wait: tr_hold).
// * Rows past QL * GQ (TR_N pads to a multiple of 8) are zero columns of Q^T: computed, never stored.
//
// Macros: verify_wgmma.cu's (QL, GQ, HK, HS, D, PAGE, QBF16, WSTAGES, WMINB, TAU; WTPS is 4), TR_N.

#if WTR
#ifndef TR_DBG
#define TR_DBG 0                  // diagnostics: 2 every stage takes the raise path
#endif
static_assert(WTPS == 4, "the transposed kernel: 4 tiles a stage (M = 64 tokens of S^T)");
static_assert(TR_N % 8 == 0 && TR_N >= WROWS && TR_N <= 64, "TR_N: the query rows rounded up to 8");

#define TR_RING 0                                             // WSTAGES stages of 4 copied tiles
#define TR_QT (WSTAGES * WTPS * WRAW)                         // Q^T: 2 blocks of 64 dims x TR_N rows x 128 bytes
#define TR_PT (TR_QT + 2 * TR_N * 128)                        // P^T of stages i & 1: 4 k-steps x TR_N rows x 32 bytes
#define TR_PTB (4 * TR_N * 32)                                // (one of them)
#define TR_QF (TR_PT + 2 * TR_PTB)                            // 2^-e of each row (64 floats)
#define TR_RED (TR_QF + 256)                                  // the warps' column maxima / sums (4 x 64 floats)
#define TR_BAR (TR_RED + 1024)                                // full[WSTAGES]
#define TR_SMEM (TR_BAR + 8 * WSTAGES + 1024)                 // + the slack that aligns the base to 1024 bytes
static_assert(TR_QT % 1024 == 0, "Q^T's swizzled blocks start 1024-byte aligned");

// Q^T, once a block: row n = tid / 2 (its dims 64 (tid & 1) ..), scaled by the row's power of two 2^e (its largest
// |x| 2^e in [128, 256), as wg_load_q: a bf16 or f16 value is exact in f16), written at logical k of dim d:
// k = 16 (d / 16) + c, c = 2 ((d / 4) % 4) + (d & 1) + 8 ((d & 2) / 2) (the A operand's dim order above), into
// the 128-byte-swizzled K-major layout (rows of 64 k). Padding rows: zeros, factor 0.
static __device__ __forceinline__ void tr_qt(unsigned char* qt, float* qf, const unsigned short* __restrict__ Q,
                                             int b, int hk, int tid, long long q_st, long long q_sh)
{
    const int n = tid >> 1, half = tid & 1;
    const bool real = n < WROWS;
    const int rn = real ? n : 0;
    const unsigned short* q = Q + (long long)(b * QL + rn / GQ) * q_st + (long long)(hk * GQ + rn % GQ) * q_sh
                              + 64 * half;
    u32 raw[32];
    float mx = 0.f;
#pragma unroll
    for (int x = 0; x < 32; ++x) {
        raw[x] = real ? *reinterpret_cast<const u32*>(q + 2 * x) : 0u;
        mx = fmaxf(mx, fmaxf(fabsf(q_value(raw[x], 0)), fabsf(q_value(raw[x], 1))));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const u32 bits = __float_as_uint(mx);
    const int e = bits ? max(-100, min(100, 7 - ((int)(bits >> 23) - 127))) : 0;
    const float s = __uint_as_float((u32)(127 + e) << 23);
    if (n < TR_N) {
        if (half == 0) qf[n] = real ? __uint_as_float((u32)(127 - e) << 23) : 0.f;
#pragma unroll
        for (int x = 0; x < 32; ++x) {
            const int d = 64 * half + 2 * x;  // dims d, d + 1: logical k, k + 1
            const int k = 16 * (d >> 4) + 2 * ((d >> 2) & 3) + 8 * ((d >> 1) & 1);
            const int off = (k >> 6) * (TR_N * 128) + n * 128 + ((((k & 63) >> 3) ^ (n & 7)) << 4) + (k & 7) * 2;
            *reinterpret_cast<u32*>(qt + off) = pack_f16x2(q_value(raw[x], 0) * s, q_value(raw[x], 1) * s);
        }
    }
}

// The per-column state of a thread (columns 8 i + 2 t4 + c): running max m (log2 units, the warpgroup's), its
// partial sum l (its own tokens), the factor of a raw score (qk_scale 2^-e of the row).
struct TrCols {
    float m[TR_N / 4], l[TR_N / 4], qk[TR_N / 4];
};

// Registers of a wgmma A operand held (read, and as far as the compiler knows rewritten) at this point: they stay
// allocated to it, not to anything written while the wgmma that reads them is in flight.
template <int N>
static __device__ __forceinline__ void tr_hold(u32 (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3]));
}
template <int M, int N>
static __device__ __forceinline__ void tr_hold(u32 (&a)[M][N][4]) {
#pragma unroll
    for (int i = 0; i < M; ++i) tr_hold(a[i]);
}

// A stage's values as the O^T A operand (raw: this thread's first value token row, 2 t4 of tile 0, in the stage's
// copy; tok: its token): k-step j (tile j), tokens 2 t4 + {0, 1} (registers 0, 1) and 2 t4 + 8 + {0, 1} (2, 3);
// va[mt][j][2 p + e]: dim 4 q + 2 mt + e, the pair 8 p + 2 t4 + {0, 1}. Tokens from valid_end: code * 0 + 0.
static __device__ __forceinline__ void tr_values(u32 (&va)[2][4][4], const unsigned char* raw, int q, int tok,
                                                 int valid_end, u32 m0, u32 m1)
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const unsigned char* r0 = raw + j * WRAW + 8 * p * WRT;
            const int t0 = tok + 16 * j + 8 * p;  // the pair's first token
            const u32 c0 = *reinterpret_cast<const unsigned short*>(r0 + D + 2 * q);
            const u32 c1 = *reinterpret_cast<const unsigned short*>(r0 + WRT + D + 2 * q);
            u32 s0 = *reinterpret_cast<const u32*>(r0 + D + D / 2);  // f16 scale | f16 zero << 16
            u32 s1 = *reinterpret_cast<const u32*>(r0 + WRT + D + D / 2);
            s0 = t0 < valid_end ? s0 : 0u;  // stale slots: code * 0 + 0
            s1 = t0 + 1 < valid_end ? s1 : 0u;
            const u32 x = prmt(c0, c1, 0x5410u), sc2 = prmt(s0, s1, 0x5410u), z2 = prmt(s0, s1, 0x7632u);
            const u32 y = x >> 8;
            va[0][j][2 * p] = wg_unpack2<0x6400u>(x, m0, sc2, z2);      // dim 4 q:     tile 0, row g
            va[0][j][2 * p + 1] = wg_unpack2<0x5400u>(x, m1, sc2, z2);  // dim 4 q + 1: tile 0, row g + 8
            va[1][j][2 * p] = wg_unpack2<0x6400u>(y, m0, sc2, z2);      // dim 4 q + 2: tile 1, row g
            va[1][j][2 * p + 1] = wg_unpack2<0x5400u>(y, m1, sc2, z2);  // dim 4 q + 3: tile 1, row g + 8
        }
}

extern "C" __global__ void __launch_bounds__(128, WMINB) tq_k8v4_verify_tr(
    const TmaMap* __restrict__ TM, const unsigned short* __restrict__ Q,
    const int* __restrict__ BT, const int* __restrict__ SL, float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int S, int min_tiles, long long q_st, long long q_sh, long long bt_sb)
{
    extern __shared__ __align__(1024) unsigned char wsm[];
    unsigned char* gbase;
    const u32 base = wg_base(wsm, gbase);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const WgBlock k = wg_block(SL, S, min_tiles);
    if (!k.live) return;  // (the whole block)
    const u32 full = base + TR_BAR;
    const int* bt = BT + (long long)k.b * bt_sb;
    int pg_lane = 0, cache0 = -32;  // warp 0's window of block-table entries (wg_produce)
    if (tid == 0) wg_barriers<0>(full, TM);
    __syncthreads();
    if (w == 0) wg_fill(TM, bt, base + TR_RING, full, k, lane, pg_lane, cache0);
    float* const qf = reinterpret_cast<float*>(gbase + TR_QF);
    float* const red = reinterpret_cast<float*>(gbase + TR_RED);
    tr_qt(gbase + TR_QT, qf, Q, k.b, k.hk, tid, q_st, q_sh);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    TrCols st;
#pragma unroll
    for (int c = 0; c < TR_N / 4; ++c) {
        st.m[c] = EMPTY_LSE;
        st.l[c] = 0.f;
        st.qk[c] = qk_scale * qf[8 * (c >> 1) + 2 * t4 + (c & 1)];
    }
    const int first_hidden = k.seq_len - QL + 1, tok_end = 16 * k.t_end;
    const int lim_min = min(first_hidden, tok_end), valid_end = min(k.seq_len, tok_end);
    const int off = (HS * k.hk) & 15;  // the head's slot in a 208-byte copied row
    const int q = 8 * w + g;            // the code quad of this thread (dims 4 q .. 4 q + 3)
    // a thread's byte offsets in a stage's copy: its key rows (tile w, tokens g, g + 8), its value tokens
    const u32 krow = w * WRAW + g * WRT + off + 4 * t4, vrow = 2 * t4 * WRT + off;
    const u64 dq = wg_desc(base + TR_QT, 16, 1024, 1), dp = wg_desc(base + TR_PT, 128, 256, 0);
    const u32 m0 = 0x000F000Fu | ((u32)min_tiles >> 31), m1 = 0x00F000F0u | ((u32)min_tiles >> 31);
    unsigned char* const pt0 = gbase + TR_PT + w * (TR_N * 32) + g * 16 + t4 * 4;  // this thread's P^T words

    float o[2][TR_N / 2];
#pragma unroll
    for (int x = 0; x < TR_N / 2; ++x) o[0][x] = o[1][x] = 0.f;
    int i = 0;
    do {  // (a live split holds a tile: no zero-trip path, whose copies of o would serialise the wgmmas)
        const int slot = i % WSTAGES;
        const int tok0 = 16 * (k.t_begin + i * WTPS);
        mbar_wait(full + 8 * slot, (i / WSTAGES) & 1);
        // the previous stage's O^T is done before any register is written: its A operand (va) and accumulators are
        // free (ptxas gives an in-flight wgmma's A registers to later values: stage i's keys overwrote them)
        wg_wait0();
        wg_keep(o[0]);
        wg_keep(o[1]);
        const unsigned char* raw = gbase + TR_RING + slot * WTPS * WRAW;
        // P^T of stage i in buffer i & 1: a warp's wait covers only its own rows of a wgmma, and every warp's rows
        // of stage i - 1's O^T read all of P^T; stage i - 2's are done (every warp waited before stage i - 1's
        // barrier)
        unsigned char* const pt = pt0 + (i & 1) * TR_PTB;
        // keys -> the S^T A operand (tokens g, g + 8 of tile w), then S^T in flight
        u32 ka[8][4];
#pragma unroll
        for (int x = 0; x < 8; ++x) {
            const u32 lo = *reinterpret_cast<const u32*>(raw + krow + 16 * x);
            const u32 hi = *reinterpret_cast<const u32*>(raw + krow + 8 * WRT + 16 * x);
            asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %4;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %2, u;\n"
                " mov.b32 {l, u}, %5;\n cvt.rn.f16x2.e4m3x2 %1, l;\n cvt.rn.f16x2.e4m3x2 %3, u;\n}\n"
                : "=r"(ka[x][0]), "=r"(ka[x][1]), "=r"(ka[x][2]), "=r"(ka[x][3]) : "r"(lo), "r"(hi));
        }
        float sc[TR_N / 2];
#pragma unroll
        for (int x = 0; x < TR_N / 2; ++x) sc[x] = 0.f;
        wg_keep(sc);
        wg_fence();  // (o is not touched until the previous stage's O^T is waited for)
        wg_mma<0>(sc, ka[0], dq, 0);
#pragma unroll
        for (int x = 1; x < 8; ++x) wg_mma<0>(sc, ka[x], wg_desc_at(dq, (x >> 2) * (TR_N * 128) + 32 * (x & 3)), 1);
        wg_commit();
        // values -> the O^T A operand while S^T runs, once the previous stage's O^T has read it (the groups
        // complete in order: all but the newest, S^T)
        u32 va[2][4][4];
        tr_values(va, raw + vrow, q, tok0 + 2 * t4, valid_end, m0, m1);  // (while S^T runs)
        wg_wait0();  // S^T
        tr_hold(ka);  // (S^T read the keys until here)
        wg_keep(sc);
        wg_keep(o[0]);
        wg_keep(o[1]);

        // mask: row n sees tokens below min(first_hidden + n / GQ, tok_end); stale tokens lie past that
        if (tok0 + 16 * WTPS > lim_min) {
#pragma unroll
            for (int x = 0; x < TR_N / 2; ++x) {
                const int n = 8 * (x >> 2) + 2 * t4 + (x & 1), tok = tok0 + 16 * w + g + 8 * ((x >> 1) & 1);
                if (tok >= min(first_hidden + n / GQ, tok_end)) sc[x] = NEG_INF;
            }
        }
        float cm[TR_N / 4];  // the warp's column maxima (raw scores)
        bool need = false;
#pragma unroll
        for (int c = 0; c < TR_N / 4; ++c) {
            float v = fmaxf(sc[4 * (c >> 1) + (c & 1)], sc[4 * (c >> 1) + (c & 1) + 2]);
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
            cm[c] = v;
            need = need || v * st.qk[c] > st.m[c] + TAU;
        }
        float p[TR_N / 2];
#pragma unroll
        for (int x = 0; x < TR_N / 2; ++x) {
            const int c = 2 * (x >> 2) + (x & 1);
            p[x] = ex2(fmaf(sc[x], st.qk[c], -st.m[c]));
        }
#pragma unroll
        for (int c = 0; c < TR_N / 8; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                *reinterpret_cast<u32*>(pt + c * 256 + e * 128) = pack_f16x2(p[4 * c + 2 * e], p[4 * c + 2 * e + 1]);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // (block-uniform) a column's max is raised: agree on it, rewrite P
        if (__syncthreads_or(need || (TR_DBG & 2))) {
            if (g == 0)
#pragma unroll
                for (int c = 0; c < TR_N / 4; ++c) red[w * 64 + 8 * (c >> 1) + 2 * t4 + (c & 1)] = cm[c];
            __syncthreads();
            float f[TR_N / 4];
#pragma unroll
            for (int c = 0; c < TR_N / 4; ++c) {
                const int n = 8 * (c >> 1) + 2 * t4 + (c & 1);
                const float mx = fmaxf(fmaxf(red[n], red[64 + n]), fmaxf(red[128 + n], red[192 + n])) * st.qk[c];
                f[c] = 1.f;
                if (mx > st.m[c] + TAU) {
                    f[c] = ex2(st.m[c] - mx);
                    st.m[c] = mx;
                    st.l[c] *= f[c];
                }
            }
#pragma unroll
            for (int x = 0; x < TR_N / 2; ++x) {
                const int c = 2 * (x >> 2) + (x & 1);
                o[0][x] *= f[c];
                o[1][x] *= f[c];
                p[x] = ex2(fmaf(sc[x], st.qk[c], -st.m[c]));
            }
#pragma unroll
            for (int c = 0; c < TR_N / 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    *reinterpret_cast<u32*>(pt + c * 256 + e * 128) =
                        pack_f16x2(p[4 * c + 2 * e], p[4 * c + 2 * e + 1]);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();  // (and red is read before a later raise writes it)
        }
#pragma unroll
        for (int x = 0; x < TR_N / 2; ++x) st.l[2 * (x >> 2) + (x & 1)] += p[x];
        wg_keep(o[0]);
        wg_keep(o[1]);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wg_mma<1>(o[0], va[0][j], wg_desc_at(dp, (i & 1) * TR_PTB + j * (TR_N * 32)), 1);
            wg_mma<1>(o[1], va[1][j], wg_desc_at(dp, (i & 1) * TR_PTB + j * (TR_N * 32)), 1);
        }
        wg_commit();
        // the stage's copy was read before the barrier (every thread's words are in registers): refilled with stage
        // i + WSTAGES, after the O^T is issued (the warpgroup's wgmma waits for all four warps)
        if (w == 0 && i + WSTAGES < k.nst)
            wg_produce(TM, bt, base + TR_RING, full, i + WSTAGES, k.t_begin, k.t_end, k.hk, lane, pg_lane, cache0);
    } while (++i < k.nst);
    wg_wait0();
    wg_keep(o[0]);
    wg_keep(o[1]);
    // the columns' sums over the block: the warp's lanes (g), then the four warps through shared memory
    __syncthreads();  // (red: the last raise's maxima are read)
#pragma unroll
    for (int c = 0; c < TR_N / 4; ++c) {
        float v = st.l[c];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (g == 0) red[w * 64 + 8 * (c >> 1) + 2 * t4 + (c & 1)] = v;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < TR_N / 4; ++c) {
        const int n = 8 * (c >> 1) + 2 * t4 + (c & 1);
        if (n >= WROWS) continue;
        const float l = (red[n] + red[64 + n]) + (red[128 + n] + red[192 + n]);
        const float inv = l > 0.f ? 1.0f / l : 0.f;
        const long long row = verify_part_row(k.b, n / GQ, k.hk, n % GQ, QL, GQ, HQW, S, k.s);
        const int x = 4 * (c >> 1) + (c & 1);  // o[tile][x]: M-row g; [x + 2]: M-row g + 8
        *reinterpret_cast<float4*>(MID_O + row * D + 4 * q) =
            make_float4(o[0][x] * inv, o[0][x + 2] * inv, o[1][x] * inv, o[1][x + 2] * inv);
        if (w == 0 && g == 0) MID_L[row] = l > 0.f ? st.m[c] + __log2f(l) : EMPTY_LSE;
    }
}
#endif
