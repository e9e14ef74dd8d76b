// TurboQuant k8v4 speculative-verify attention with warpgroup MMAs (sm_90a): every KV tile is read and
// unpacked once for all QL * GQ <= 64 query rows of a KV head.
//
// Compiled by NVRTC after decode_k8v4.cu and the wgmma wrappers (wg_mma, generated: verify_wg.mma_wrappers;
// verify_wg.py concatenates them), whose helpers it uses (mbarriers, split_of, ex2, the fp16 packers) and whose
// merges (tq_k8v4_merge_rows / tq_k8v4_merge) combine the splits written here, in the same partial layout as
// verify_k8v4.cu.
//
// Two kernels, one per build (WFST): a block serves one (request b, split s, KV head hk).
// * tq_k8v4_verify_ws (WFST >= 2, the default): two warpgroups. Warpgroup 0 streams and converts (the copies and
//   the conversion below) into a ring of WFST f16 stages; warpgroup 1 runs the scores, the softmax and the P.V on
//   them (see the kernel). Shipped from 17 rows per KV head: docs/bench-mtp-verify-h200.md, rounds 8 and 9.
// * tq_k8v4_verify_wg (WFST = 0): one warpgroup does all of it, stage by stage (round 7). The rest of this
//   comment describes it; the specialised kernel splits the same steps between its warpgroups.
//
// * Warp 0 (lane 0) streams the split's 16-token tiles with one TMA tensor copy each, from a
//   3-D tensor map over the cache ([row bytes, page tokens, blocks]): 208 bytes of each token row from HS * hk
//   rounded down to 16 bytes (a box must start 16-byte aligned: HS = 196 is not a multiple of 16), i.e. the
//   head's slot at byte `off` = (HS * hk) % 16 of each 208-byte row. A stage holds WTPS tiles (N = 16 WTPS
//   tokens); a ring of WSTAGES stages with full mbarriers; a stage is refilled (stage i + WSTAGES) right after
//   the block barrier that ends its unpacking, so no empty barriers and no producer warp.
// * The warpgroup converts each tile's keys (e4m3 -> f16, exact) into the 128-byte-swizzled K-major layout of
//   wgmma's B operand (the layout TMA's 128-byte swizzle writes: two blocks of 64 dims), and unpacks its values
//   (below): the stage's copy is free after that (WgLane, wg_load, wg_keys, wg_values).
// * Scores: S = Q K^T, M = 64 query rows (row r = t * GQ + h: token t, head h of the group; rows past
//   QL * GQ are zeros), N = the stage's tokens, K = 128 dims, as f16 wgmmas m64nNk16 with fp32 accumulators.
//   The query is the A operand in registers, f16, each row times its own power of two 2^e (its largest |x| 2^e
//   in [128, 256): bf16's range fits f16's, and a bf16 or f16 value keeps all its bits), which the row folds into
//   its qk_scale. (Measured and dropped: fp8 wgmmas on the raw keys with the query as two exact e4m3 terms, the
//   same tensor time, no key conversion, but the fp8 accumulation lost precision at large logits:
//   docs/bench-mtp-verify-h200.md.)
// * Values: the warpgroup unpacks the stage's codes once into f16 values (code * scale + zero, one
//   fused rounding) in shared memory, the MN-major no-swizzle operand layout of wgmma (8 dims x 8 tokens
//   core matrices); tokens past the split's end or seq_len are written as zeros (stale bytes never reach an
//   MMA). Within each group of 8 dims the columns are stored as dims 0 4 1 5 2 6 3 7 (the unpack's natural
//   order), which the output write undoes.
// * Softmax: per row, in registers, on the S accumulators (thread: M-rows 16 w + g, 16 w + g + 8, which hold query rows
//   16 w + g and + 8, or with at most 32 rows 8 w + g and padding: wg_row, WHALF; tokens
//   8 i + 2 t4, + 1 of each n8 block i); lazy running max (raised, with a rescale of the row's O and l, only
//   when a score exceeds it by TAU). The causal limit of row t is
//   seq_len - QL + 1 + t, and no row sees past the split's last tile: one per-row limit, applied only on
//   stages that reach it. Warps whose rows are all padding skip the softmax (P = 0).
// * P.V: O (64 x 128, fp32) += P (f16, the S accumulators re-packed as the A operand in registers) . V, one
//   m64n128k16 wgmma per tile, left in flight while the next stage's keys and values are unpacked.
// * The split's partials: O / l and the log2-sum-exp m + log2(l) per row (rows that saw no token: zeros and
//   EMPTY_LSE), at row (b * QL * HQ + t * HQ + hk * GQ + h) * S + s, verify_k8v4.cu's layout.
//
// Macros: QL, GQ, HK (KV heads), HS (bytes between two KV heads' slots), D (128 only), PAGE, QBF16,
// WTPS (tiles per stage: 1, 2 or 4), WSTAGES (ring depth), WMINB (blocks per SM for the register budget),
// TAU; WV_LBO / WV_SBO: the value operand's descriptor strides (bytes) for its 8-token / 8-dim core-matrix
// steps; WFST, WREG_DQ, WREG_MMA: the specialised kernel's f16 stages and its warpgroups' registers; WTR = 1: the
// build is verify_tr.cu's kernel (this file's two are compiled out, its helpers kept).

#ifndef WTPS
#define WTPS 4
#endif
#ifndef WSTAGES
#define WSTAGES 3
#endif
#ifndef WMINB
#define WMINB 2
#endif
#ifndef WV_LBO
#define WV_LBO 128                // bytes between the two 8-token core matrices of a value tile
#endif
#ifndef WV_SBO
#define WV_SBO 256                // bytes between two 8-dim groups of a value tile
#endif
#ifndef WG_DBG
#define WG_DBG 0                  // diagnostics (wrong outputs): 1 no score wgmma, 2 no P.V wgmma, 4 no tensor copies,
#endif                            // 8 no conversion (the copies are loaded, nothing is written), 16 values unpacked
                                  // but not stored (no f16 value bytes written)
#ifndef WSPREAD
#define WSPREAD 1                 // at most 32 query rows: 8 a warp, so all four warps share the softmax (WHALF)
#endif
#ifndef WEARLY
#define WEARLY 1                  // tq_k8v4_verify_ws: an f16 stage is freed as soon as its P.V is done
#endif
#define WROWS (QL * GQ)           // query rows of the KV head
#define WN (16 * WTPS)            // tokens per stage (N of the score wgmma)
#define WRT 208                   // bytes of a token's slot one copy reads: 13 x 16 from HS hk rounded down to 16
#define WRAW (16 * WRT)           // bytes of one tile's copy
#define WKT 4096                  // bytes of one tile's f16 keys (16 rows x 256: two 128-byte swizzled blocks)
#define WVF 4096                  // bytes of one tile's f16 values (128 dims x 16 tokens)
#define WK_OFF 0                                     // the keys of one stage (1024-byte aligned)
#define WF_OFF (WK_OFF + WTPS * WKT)                 // two stages' f16 values
#define WR_OFF (WF_OFF + 2 * WTPS * WVF)             // the ring of copied tiles
#define WB_OFF (WR_OFF + WSTAGES * WTPS * WRAW)      // full[WSTAGES]
#define WSMEM (WB_OFF + 8 * WSTAGES + 1024)          // + the slack that aligns the base to 1024 bytes
#define HQW (HK * GQ)
#ifndef WFST
#define WFST 0                    // 0: tq_k8v4_verify_wg; 2+: tq_k8v4_verify_ws, a ring of WFST converted f16 stages
#endif
#ifndef WREG_DQ
#define WREG_DQ 80                // tq_k8v4_verify_ws: registers of the converting warpgroup
#endif
#ifndef WTR
#define WTR 0                     // 1: verify_tr.cu's transposed kernel is the build's (neither kernel below)
#endif
#ifndef WREG_MMA
#define WREG_MMA 176              // and of the MMA warpgroup (together at most 65536 / (128 WMINB))
#endif
#define WS_STAGE (2 * WTPS * WKT)                    // one converted stage: keys (WTPS * WKT) then values
#define WS_R_OFF (WFST * WS_STAGE)                   // the ring of copied tiles
#define WS_B_OFF (WS_R_OFF + WSTAGES * WTPS * WRAW)  // full[WSTAGES], kfull[WFST], kempty[WFST]
#define WS_SMEM (WS_B_OFF + 8 * (WSTAGES + 2 * WFST) + 1024)
static_assert(WFST == 0 || (WFST >= 2 && (WREG_DQ + WREG_MMA) * WMINB <= 512 && WREG_DQ % 8 == 0
                            && WREG_MMA % 8 == 0), "the specialised kernel: 2+ f16 stages, registers that fit");
static_assert(D == 128, "the wgmma verify kernel: head dim 128");
static_assert(WROWS >= 1 && WROWS <= 64, "at most 64 query rows per KV head (one m64 tile)");
static_assert(WTPS == 1 || WTPS == 2 || WTPS == 4, "1, 2 or 4 tiles per stage (3 spilled: not built)");
static_assert(PAGE % 16 == 0, "pages of whole tiles");

// A tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), in global memory: the host encodes the cache's
// map once per cache tensor and copies it to the device (verify_wg.tensor_maps), so a launch passes a pointer.
struct __align__(64) TmaMap { unsigned long long v[16]; };

static __device__ __forceinline__ void tma_load_3d(u32 dst, const TmaMap* map, int x, int y, int z, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}

// wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte units), layout
// (0: no swizzle, 1: 128-byte swizzle).
static __device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo, u32 layout) {
    return (u64)((addr >> 4) & 0x3FFFu) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) | ((u64)((sbo >> 4) & 0x3FFFu) << 32)
           | ((u64)layout << 62);
}
// The descriptor of the operand `bytes` further on (16-byte aligned): its address field plus bytes / 16, on the low
// word alone (shared addresses stay below 2^18 bytes: no carry out of the 14-bit field), one add.
static __device__ __forceinline__ u64 wg_desc_at(u64 d, u32 bytes) {
    return ((d >> 32) << 32) | (u32)((u32)d + (bytes >> 4));
}
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wg_keep(float (&d)[N]) {  // the accumulators stay put across the async MMA
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The wgmma of every N, wg_mma<TB>(d, a, desc, acc): d (64 x N, fp32) [+]= A (f16 registers, k = 16) . B (f16, by
// descriptor; TB: its transpose bit), acc = 0: the product alone. Overloads by N (the accumulator array's size),
// generated by verify_wg.mma_wrappers before this file.

// WHALF: at most 32 query rows, 8 a warp at M-rows 16 w + g (the rows g + 8 are padding), so all four warps share the
// softmax and each thread runs it for one row; else rows 16 w + g and + 8 (more than 32 rows, or WSPREAD = 0).
#if WSPREAD && WROWS <= 32
#define WHALF 1
#else
#define WHALF 0
#endif
// The query row (t * GQ + h) at M-row 16 w + g + 8 e of the m64 tile, or -1 (a padding row).
static __device__ __forceinline__ int wg_row(int w, int g, int e) {
    const int r = WHALF ? (e ? WROWS : 8 * w + g) : 16 * w + g + 8 * e;
    return r < WROWS ? r : -1;
}

// The query rows of warp w as the score wgmma's A operand, f16: k16 step j, qa[j][i] holds M-row 16 w + g (i = 0, 2)
// or 16 w + g + 8 (i = 1, 3) (the query rows wg_row names; zeros for padding), dims 16 j + 2 t4 + {0, 1} (i = 0, 1)
// or 16 j + 8 + 2 t4 + {0, 1} (i = 2, 3). Each row is scaled by its own power of two 2^e (its largest |x| 2^e in
// [128, 256): the four t4 lanes hold its 128 values), so a bf16 or f16 value is exact in f16 unless it lies below
// 2^-32 of its row's largest; f[0] / f[1] = 2^-e of M-rows g / g + 8, the factors of their scores (padding rows:
// zero queries).
static __device__ __forceinline__ float q_value(u32 w, int hi) {
#if QBF16
    return __uint_as_float(hi ? (w & 0xFFFF0000u) : (w << 16));
#else
    return hi ? f16_hi(w) : f16_lo(w);
#endif
}
static __device__ __forceinline__ void wg_load_q(u32 (&qa)[8][4], float (&f)[2], const unsigned short* __restrict__ Q,
                                                 int b, int hk, int w, int g, int t4, long long q_st, long long q_sh)
{
    const int r0 = wg_row(w, g, 0), r1 = wg_row(w, g, 1);
    const bool ok0 = r0 >= 0, ok1 = r1 >= 0;
    const int rr0 = ok0 ? r0 : 0, rr1 = ok1 ? r1 : 0;
    const unsigned short* q0 = Q + (long long)(b * QL + rr0 / GQ) * q_st + (long long)(hk * GQ + rr0 % GQ) * q_sh
                               + 2 * t4;
    const unsigned short* q1 = Q + (long long)(b * QL + rr1 / GQ) * q_st + (long long)(hk * GQ + rr1 % GQ) * q_sh
                               + 2 * t4;
    u32 raw[8][4];
    float mx[2] = {0.f, 0.f};  // the largest |x| of each row
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const bool ok = i & 1 ? ok1 : ok0;
            const u32 wv = ok ? *reinterpret_cast<const u32*>((i & 1 ? q1 : q0) + 16 * j + (i & 2 ? 8 : 0)) : 0u;
            raw[j][i] = wv;
            mx[i & 1] = fmaxf(mx[i & 1], fmaxf(fabsf(q_value(wv, 0)), fabsf(q_value(wv, 1))));
        }
    float s[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
        // 2^x with the row's largest |x| 2^x in [128, 256): x = 7 - (its exponent); an all-zero row: x = 0
        const u32 bits = __float_as_uint(mx[e]);
        const int x = bits ? max(-100, min(100, 7 - ((int)(bits >> 23) - 127))) : 0;
        s[e] = __uint_as_float((u32)(127 + x) << 23);
        f[e] = __uint_as_float((u32)(127 - x) << 23);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qa[j][i] = pack_f16x2(q_value(raw[j][i], 0) * s[i & 1], q_value(raw[j][i], 1) * s[i & 1]);
}

// Two 4-bit codes (nibble k of each 16-bit half of x: bits 0..3 with MAGIC 0x6400, 1024 + code; bits 4..7 with
// MAGIC 0x5400, 64 + code: the f16 whose mantissa they land in has unit 1 there) as an f16x2 code * scale + zero:
// the subtraction exact, one fused rounding.
template <u32 MAGIC>
static __device__ __forceinline__ u32 wg_unpack2(u32 x, u32 mask, u32 sc2, u32 z2) {
    u32 h, c, r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(h) : "r"(x), "r"(mask), "n"(MAGIC * 0x10001u));  // (x & mask) | magic
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(c) : "r"(h), "r"(MAGIC * 0x10001u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(c), "r"(sc2), "r"(z2));
    return r;
}

#ifndef WV_DESC_LBO
#define WV_DESC_LBO WV_LBO        // the value descriptor's leading byte offset (the 8-token step)
#endif
#ifndef WV_DESC_SBO
#define WV_DESC_SBO WV_SBO        // and its stride byte offset (the 8-dim step)
#endif

// Stage i's copies into the ring at ring (warp 0; lane 0 issues them): its tiles' pages come from the lanes' window
// of 32 block-table entries (cache0: its first tile), refilled with one load when a tile leaves it.
static __device__ __forceinline__ void wg_produce(const TmaMap* TM, const int* __restrict__ bt, u32 ring, u32 full,
                                                  int i, int t_begin, int t_end, int hk, int lane, int& pg_lane,
                                                  int& cache0)
{
    const int slot = i % WSTAGES;
    const int T0 = t_begin + i * WTPS, nt = min(WTPS, t_end - T0);
    if (lane == 0) mbar_expect(full + 8 * slot, WG_DBG & 4 ? 0 : nt * WRAW);
#pragma unroll
    for (int j = 0; j < WTPS; ++j) {
        if (j >= nt) break;
        const int T = T0 + j;
        if (T - cache0 >= 32) {
            cache0 = T;
            pg_lane = T + lane < t_end ? bt[(16 * (T + lane)) / PAGE] : 0;
        }
        const int pg = __shfl_sync(0xffffffffu, pg_lane, T - cache0);
        if (lane == 0 && !(WG_DBG & 4))
            tma_load_3d(ring + (slot * WTPS + j) * WRAW, TM, (HS * hk) & ~15, (16 * T) % PAGE, pg,
                        full + 8 * slot);
    }
}

// A converting thread's (tid of 128) fixed byte offsets, made once: every address of wg_convert is then
// one of these plus the stage's base and a constant.
// * Keys: warp w takes rows 4 w .. 4 w + 3 of each tile, lane l the key bytes 4 l .. 4 l + 3 of a row (a warp
//   reads one 128-byte row: no bank conflicts), written as their 8 bytes of f16 into the score wgmma's B operand:
//   two column blocks of 64 dims, [WN rows x 128 bytes] each, the 16-byte piece q of row R at
//   R * 128 + ((q ^ (R % 8)) * 16), as TMA's 128-byte swizzle would write it (R % 8 does not depend on the tile).
// * Values: token t = tid % 16 of each tile, code words u0 = tid / 16 and u0 + 8 (dims 8 u0 .. + 7, 8 u0 + 64 ..)
//   into the P.V wgmma's B operand: per tile, the MN-major no-swizzle layout (8 dims x 8 tokens core matrices),
//   the 8 dims of a group stored as 0 4 1 5 2 6 3 7.
struct WgLane {
    u32 ksrc, kdst[4];  // key word of row 4 w (a copied tile), its f16 bytes in row 4 w + x (a stage's keys)
    u32 vsrc, ssrc;     // code word u0 of token t in a copied tile, its scale and zero
    u32 vdst;           // the f16 piece of word u0 in a converted tile
    int t;
    u32 mask[2];        // 0x000F000F, 0x00F000F0 (wg_unpack8)
};
// (zero: a value the compiler cannot fold, so the masks stay in registers)
static __device__ __forceinline__ WgLane wg_lane(int tid, int off, u32 zero)
{
    WgLane L;
    L.mask[0] = 0x000F000Fu | zero;
    L.mask[1] = 0x00F000F0u | zero;
    const int w = tid >> 5, lane = tid & 31;
    const int q = (lane >> 1) & 7;
    L.ksrc = off + 4 * w * WRT + 4 * lane;
#pragma unroll
    for (int x = 0; x < 4; ++x)
        L.kdst[x] = (lane >> 4) * (WN * 128) + (4 * w + x) * 128 + ((q ^ ((4 * w + x) & 7)) << 4) + (lane & 1) * 8;
    // a warp reads 8 tokens x 4 code words: 32 distinct banks (token rows are 52 words apart)
    L.t = (lane & 7) + 8 * (w & 1);
    const int u0 = (lane >> 3) + 4 * (w >> 1);
    L.vsrc = off + L.t * WRT + D + 4 * u0;
    L.ssrc = off + L.t * WRT + D + D / 2;
    L.vdst = u0 * WV_SBO + (L.t >> 3) * WV_LBO + (L.t & 7) * 16;
    return L;
}

// Eight codes (one cache word x: dims 8 u + 0..7, dim 2 i in the low nibble of byte i) as two 16-byte f16 pieces:
// word k = {dim k, dim k + 4} (nibble k of each half; one shift for nibbles 2 and 3). The masks 0x000F000F and
// 0x00F000F0 come in registers (WgLane: else ptxas makes them again for every use).
static __device__ __forceinline__ uint4 wg_unpack8(u32 x, u32 sc2, u32 z2, const u32 (&m)[2]) {
    const u32 y = x >> 8;
    return make_uint4(wg_unpack2<0x6400u>(x, m[0], sc2, z2), wg_unpack2<0x5400u>(x, m[1], sc2, z2),
                      wg_unpack2<0x6400u>(y, m[0], sc2, z2), wg_unpack2<0x5400u>(y, m[1], sc2, z2));
}

// A thread's words of one stage's copy (wg_lane's offsets): key words kw, code words cw (u0, u0 + 8), scale | zero.
struct WgRaw {
    u32 kw[WTPS][4], cw[WTPS][2], szw[WTPS];
};
static __device__ __forceinline__ void wg_load(WgRaw& r, const unsigned char* raw, const WgLane& L)
{
#pragma unroll
    for (int j = 0; j < WTPS; ++j) {
#pragma unroll
        for (int x = 0; x < 4; ++x) r.kw[j][x] = *reinterpret_cast<const u32*>(raw + L.ksrc + j * WRAW + x * WRT);
        r.cw[j][0] = *reinterpret_cast<const u32*>(raw + L.vsrc + j * WRAW);
        r.cw[j][1] = *reinterpret_cast<const u32*>(raw + L.vsrc + j * WRAW + 32);
        r.szw[j] = *reinterpret_cast<const u32*>(raw + L.ssrc + j * WRAW);  // f16 scale | f16 zero << 16
    }
}
static __device__ __forceinline__ void wg_write(unsigned char* kb, unsigned char* vb, const WgRaw& r,
                                                const WgLane& L, int nt, int tok0, int seq_len)
{
#pragma unroll
    for (int j = 0; j < WTPS; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            uint2 h;  // (the halves of the word as they are: no shift for the upper one)
            asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, u;\n}\n"
                : "=r"(h.x), "=r"(h.y) : "r"(r.kw[j][x]));
            *reinterpret_cast<uint2*>(kb + L.kdst[x] + j * 16 * 128) = h;
        }
    const int left = seq_len - tok0 - L.t;  // tile j holds this thread's token where 16 j < left
#if WG_DBG & 16
    u32 sink = 0u;  // (the values unpacked, not stored: a store no run reaches keeps the unpack)
#endif
#pragma unroll
    for (int j = 0; j < WTPS; ++j) {
        const bool ok = j < nt && 16 * j < left;  // else zeros: code (a small integer) * 0 + 0
        const u32 sc2 = ok ? prmt(r.szw[j], 0u, 0x1010u) : 0u, z2 = ok ? prmt(r.szw[j], 0u, 0x3232u) : 0u;
#if WG_DBG & 16
        const uint4 a = wg_unpack8(r.cw[j][0], sc2, z2, L.mask), c = wg_unpack8(r.cw[j][1], sc2, z2, L.mask);
        sink ^= a.x ^ a.y ^ a.z ^ a.w ^ c.x ^ c.y ^ c.z ^ c.w;
#else
        *reinterpret_cast<uint4*>(vb + L.vdst + j * WVF) = wg_unpack8(r.cw[j][0], sc2, z2, L.mask);
        *reinterpret_cast<uint4*>(vb + L.vdst + j * WVF + 8 * WV_SBO) = wg_unpack8(r.cw[j][1], sc2, z2, L.mask);
#endif
    }
#if WG_DBG & 16
    if (left == -0x7fffffff) *reinterpret_cast<u32*>(vb + L.vdst) = sink;  // (seq_len: from memory)
#endif
}
// A stage's keys (e4m3 -> f16, exact) into kb and its values (code * scale + zero) into vb, from its copy raw (the
// tiles' rows of WRT bytes). Every word is loaded before the first store (the compiler cannot tell the copy from
// the operands, so a load after a store would wait for it). Values of tiles past the stage's nt copied ones and of
// tokens from seq_len are zeros, with a zero scale and zero point (stale codes are small integers: stale bytes
// never reach an MMA as anything else; stale keys are masked by the softmax).
static __device__ __forceinline__ void wg_convert(unsigned char* kb, unsigned char* vb, const unsigned char* raw,
                                                  const WgLane& L, int nt, int tok0, int seq_len)
{
    WgRaw r;
    wg_load(r, raw, L);
#if !(WG_DBG & 8)
    wg_write(kb, vb, r, L, nt, tok0, seq_len);
#endif
}

// The per-row state of a warp's two rows (g, g + 8): running max m (log2 units), sum l, the causal / split limits.
struct WgRows {
    float m0, m1, l0, l1;
};

// A block's request b, split s and KV head hk (blockIdx.x = (b * S + s) * HK + hk), and its split's tiles
// [t_begin, t_end) in nst stages; live = false: the split holds no tile (the whole block returns).
struct WgBlock {
    int hk, s, b, seq_len, t_begin, t_end, nst;
    bool live;
};
static __device__ __forceinline__ WgBlock wg_block(const int* __restrict__ SL, int S, int min_tiles)
{
    WgBlock k;
    k.hk = blockIdx.x % HK;
    const int bs = blockIdx.x / HK;
    k.s = bs % S;
    k.b = bs / S;
    k.seq_len = SL[k.b];
    const Split sp = split_of(k.seq_len, S, min_tiles);
    k.live = k.s < sp.n_act;
    k.t_begin = k.s * sp.tiles_per;
    k.t_end = min(k.t_begin + sp.tiles_per, sp.n_tiles);
    k.nst = (k.t_end - k.t_begin + WTPS - 1) / WTPS;
    return k;
}

// The three kernels' common start. The block's dynamic shared memory from its first 1024-byte boundary (the swizzled
// operands' atom): its shared address and a pointer to it.
static __device__ __forceinline__ u32 wg_base(unsigned char* wsm, unsigned char*& gbase) {
    const u32 sbase = smem_addr(wsm), base = (sbase + 1023u) & ~1023u;
    gbase = wsm + (base - sbase);
    return base;
}
// Thread 0's barriers: full[WSTAGES] (the copies) at `full`, then NF16 pairs kfull (1 arrival) / kempty (4: one a
// warp of the MMA warpgroup) of the specialised kernel; the inits fenced, and the tensor map (written by the
// host's copy through the generic proxy) acquired once. The block waits for them (__syncthreads) after.
template <int NF16>
static __device__ __forceinline__ void wg_barriers(u32 full, const TmaMap* TM) {
#pragma unroll
    for (int i = 0; i < WSTAGES; ++i) mbar_init(full + 8 * i, 1);
#pragma unroll
    for (int i = 0; i < NF16; ++i) {
        mbar_init(full + 8 * WSTAGES + 8 * i, 1);
        mbar_init(full + 8 * (WSTAGES + NF16) + 8 * i, 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(TM) : "memory");
}
// Warp 0: the ring's first min(WSTAGES, nst) stages (wg_produce).
static __device__ __forceinline__ void wg_fill(const TmaMap* TM, const int* __restrict__ bt, u32 ring, u32 full,
                                               const WgBlock& k, int lane, int& pg_lane, int& cache0) {
    for (int i = 0; i < min(WSTAGES, k.nst); ++i)
        wg_produce(TM, bt, ring, full, i, k.t_begin, k.t_end, k.hk, lane, pg_lane, cache0);
}

// The MMA warpgroup's rows of warp w (16 w + g and + 8): the query as the score wgmma's A operand (wg_load_q), the
// rows' log2 units per raw score, and the causal / split limits: row t sees tokens [0, seq_len - QL + 1 + t) and
// none past the split; stages reaching past lim_min are masked.
struct WgQuery {
    u32 qa[8][4];
    float qk0, qk1;
    bool active;  // (warp-uniform) rows of this warp are real query rows
    int row0, row1, lim0, lim1, lim_min;  // the rows (wg_row) of M-rows 16 w + g and + 8
};
static __device__ __forceinline__ void wg_query(WgQuery& R, const unsigned short* __restrict__ Q, const WgBlock& k,
                                                int w, int lane, float qk_scale, long long q_st, long long q_sh)
{
    const int g = lane >> 2, t4 = lane & 3;
    float qf[2];
    wg_load_q(R.qa, qf, Q, k.b, k.hk, w, g, t4, q_st, q_sh);
    R.qk0 = qk_scale * qf[0];
    R.qk1 = qk_scale * qf[1];
    R.active = wg_row(w, 0, 0) >= 0;  // (the warp's first row)
    R.row0 = wg_row(w, g, 0);
    R.row1 = wg_row(w, g, 1);
    const int first_hidden = k.seq_len - QL + 1, tok_end = 16 * k.t_end;
    R.lim0 = R.row0 >= 0 ? min(first_hidden + R.row0 / GQ, tok_end) : 0;
    R.lim1 = R.row1 >= 0 ? min(first_hidden + R.row1 / GQ, tok_end) : 0;
    R.lim_min = min(first_hidden, tok_end);
}

// The softmax of one stage's scores sc (rows g, g + 8 of warp w; tokens from tok0): P as the P.V wgmma's A
// operand pa (zeros in a warp of padding rows), the rows' state updated, and f0 / f1 the factors O must be scaled
// by (1: no rescale). Lazy running max: raised, with a rescale, only when a score exceeds it by TAU. A row sees
// tokens below its limit (R.lim0 / R.lim1); only stages reaching past R.lim_min are masked.
static __device__ __forceinline__ void wg_softmax(float (&sc)[WN / 2], u32 (&pa)[WTPS][4], float& f0, float& f1,
                                                  WgRows& st, const WgQuery& R, int tok0, int t4)
{
    u32 pt[WTPS][4];
    f0 = 1.f;
    f1 = 1.f;
    if (R.active) {
        if (tok0 + WN > R.lim_min) {
#pragma unroll
            for (int k = 0; k < WN / 2; ++k) {
                const int tok = tok0 + 8 * (k >> 2) + 2 * t4 + (k & 1);
                if (tok >= (k & 2 ? R.lim1 : R.lim0)) sc[k] = NEG_INF;
            }
        }
        float r0[WN / 4], r1[WN / 4];  // the two rows' scores (k & 2: row g + 8), maxima by a tree (a short chain)
#pragma unroll
        for (int i = 0; i < WN / 4; ++i) {
            r0[i] = sc[4 * (i >> 1) + (i & 1)];
            r1[i] = sc[4 * (i >> 1) + (i & 1) + 2];
        }
#define WG_HALVE(H)                                                                                               \
    _Pragma("unroll") for (int i = 0; i < (H); ++i) {                                                             \
        r0[i] = fmaxf(r0[i], r0[i + (H)]);                                                                        \
        r1[i] = fmaxf(r1[i], r1[i + (H)]);                                                                        \
    }
        WG_HALVE(WN / 8)  // (constant trip counts, 0 where WN is smaller: the arrays stay in registers)
        WG_HALVE(WN / 16)
        WG_HALVE(WN / 32)
        WG_HALVE(WN / 64)
#undef WG_HALVE
        float mx0 = r0[0], mx1 = r1[0];
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2)) * R.qk0;
        if (!WHALF) {
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2)) * R.qk1;
        }
        if (mx0 > st.m0 + TAU) {  // (the factors scale O outside any branch: ptxas serialises the wgmmas when
            f0 = ex2(st.m0 - mx0);  // their accumulators are written on a divergent path)
            st.m0 = mx0;
            st.l0 *= f0;
        }
        if (!WHALF && mx1 > st.m1 + TAU) {
            f1 = ex2(st.m1 - mx1);
            st.m1 = mx1;
            st.l1 *= f1;
        }
#pragma unroll
        for (int j = 0; j < WTPS; ++j) {
            float p[8];
#pragma unroll
            for (int e = 0; e < 8; ++e)  // (WHALF: the rows g + 8 are padding, P = 0)
                p[e] = WHALF && (e & 2) ? 0.f
                                        : ex2(fmaf(sc[8 * j + e], e & 2 ? R.qk1 : R.qk0, -(e & 2 ? st.m1 : st.m0)));
            st.l0 += (p[0] + p[1]) + (p[4] + p[5]);
            if (!WHALF) st.l1 += (p[2] + p[3]) + (p[6] + p[7]);
            pt[j][0] = pack_f16x2(p[0], p[1]);
            pt[j][1] = pack_f16x2(p[2], p[3]);
            pt[j][2] = pack_f16x2(p[4], p[5]);
            pt[j][3] = pack_f16x2(p[6], p[7]);
        }
    }
    // defined outside the branch (ptxas serialises every wgmma of the kernel when an input register of one is
    // written on a divergent path)
#pragma unroll
    for (int j = 0; j < WTPS; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) pa[j][x] = R.active ? pt[j][x] : 0u;
}

// O *= the rows' factors, then O += P V (vb: the stage's f16 values), left in flight (committed, not waited). P
// and O are defined before the fence: ptxas serialises wgmmas whose input registers are written inside their
// pipeline stage.
static __device__ __forceinline__ void wg_attend(float (&o)[64], u32 (&pa)[WTPS][4], float f0, float f1, u32 vb)
{
    if (__any_sync(0xffffffffu, f0 != 1.f || f1 != 1.f))  // (warp-uniform: a raised running max is rare)
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        o[4 * k] *= f0;
        o[4 * k + 1] *= f0;
        o[4 * k + 2] *= f1;
        o[4 * k + 3] *= f1;
    }
    const u64 dv0 = wg_desc(vb, WV_DESC_LBO, WV_DESC_SBO, 0);
    u64 dv[WTPS];
#pragma unroll
    for (int j = 0; j < WTPS; ++j) {
        dv[j] = wg_desc_at(dv0, j * WVF);
        asm volatile("" : "+r"(pa[j][0]), "+r"(pa[j][1]), "+r"(pa[j][2]), "+r"(pa[j][3]));
    }
    wg_keep(o);
    wg_fence();
#if !(WG_DBG & 2)
#pragma unroll
    for (int j = 0; j < WTPS; ++j) wg_mma<1>(o, pa[j], dv[j], 1);  // (V: MN-major)
#endif
    wg_commit();
    wg_keep(o);
}

// S = Q K^T of a stage (kb: its f16 keys), waited for, with every earlier wgmma (the previous stage's P.V). The
// accumulators are defined before the fence, though the first MMA ignores them.
static __device__ __forceinline__ void wg_scores(float (&sc)[WN / 2], float (&o)[64], const u32 (&qa)[8][4], u32 kb)
{
#pragma unroll
    for (int k = 0; k < WN / 2; ++k) sc[k] = 0.f;
    wg_keep(sc);
    wg_fence();
#if WG_DBG & 1
#pragma unroll
    for (int k = 0; k < WN / 2; ++k) sc[k] = (float)(k & 3);
#else
    // k16 step j: dims 64 (j / 4) + 16 (j % 4) + 0..15 (column block j / 4, 32 bytes a step within its rows)
    const u64 d0 = wg_desc(kb, 16, 1024, 1);
    wg_mma<0>(sc, qa[0], d0, 0);
#pragma unroll
    for (int j = 1; j < 8; ++j) wg_mma<0>(sc, qa[j], wg_desc_at(d0, (j >> 2) * (WN * 128) + 32 * (j & 3)), 1);
#endif
    wg_commit();
    wg_keep(sc);
    wg_wait0();
    wg_keep(sc);
    wg_keep(o);
}

// The split's partials of the warp's rows: O / l and the log2-sum-exp m + log2(l) (rows that saw no token: zeros
// and EMPTY_LSE), at row (b * QL * HQ + t * HQ + hk * GQ + h) * S + s (verify_part_row), verify_k8v4.cu's layout.
static __device__ __forceinline__ void wg_store(const float (&o)[64], WgRows st, const WgQuery& R, int b, int hk,
                                                int s, int S, int t4, float* __restrict__ MID_O,
                                                float* __restrict__ MID_L)
{
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, 1);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, 1);
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, 2);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, 2);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int r = e ? R.row1 : R.row0;
        if (r < 0) continue;
        const int t = r / GQ, h = r % GQ;
        const long long row = verify_part_row(b, t, hk, h, QL, GQ, HQW, S, s);
        const float l = e ? st.l1 : st.l0, m = e ? st.m1 : st.m0;
        const float inv = l > 0.f ? 1.0f / l : 0.f;
        float* op = MID_O + row * D + t4;
#pragma unroll
        for (int k = 0; k < 16; ++k) {  // columns 8 k + 2 t4 (+ 1) hold dims 8 k + t4 (+ 4)
            op[8 * k] = o[4 * k + 2 * e] * inv;
            op[8 * k + 4] = o[4 * k + 2 * e + 1] * inv;
        }
        if (t4 == 0) MID_L[row] = l > 0.f ? m + __log2f(l) : EMPTY_LSE;
    }
}

#if WTR
// (the build's kernel is verify_tr.cu's tq_k8v4_verify_tr)
#elif WFST == 0
extern "C" __global__ void __launch_bounds__(128, WMINB) tq_k8v4_verify_wg(
    const TmaMap* __restrict__ TM, const unsigned short* __restrict__ Q,
    const int* __restrict__ BT, const int* __restrict__ SL, float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int S, int min_tiles, long long q_st, long long q_sh, long long bt_sb)
{
    extern __shared__ __align__(1024) unsigned char wsm[];
    unsigned char* gbase;
    const u32 base = wg_base(wsm, gbase);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const WgBlock k = wg_block(SL, S, min_tiles);
    if (!k.live) return;  // (the whole block)
    const u32 full = base + WB_OFF;
    const int* bt = BT + (long long)k.b * bt_sb;
    int pg_lane = 0, cache0 = -32;  // warp 0's window of block-table entries (wg_produce)
    if (tid == 0) wg_barriers<0>(full, TM);
    __syncthreads();
    if (w == 0) wg_fill(TM, bt, base + WR_OFF, full, k, lane, pg_lane, cache0);

    // the warpgroup's rows, operands and state
    const int t4 = lane & 3;
    WgQuery R;
    wg_query(R, Q, k, w, lane, qk_scale, q_st, q_sh);
    const WgLane L = wg_lane(tid, (HS * k.hk) & 15, (u32)min_tiles >> 31);  // (the head's slot in a 208-byte row)
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    WgRows st = {EMPTY_LSE, EMPTY_LSE, 0.f, 0.f};
    for (int i = 0; i < k.nst; ++i) {
        const int slot = i % WSTAGES;
        const int T0 = k.t_begin + i * WTPS, nt = min(WTPS, k.t_end - T0), tok0 = 16 * T0;
        mbar_wait(full + 8 * slot, (i / WSTAGES) & 1);
        const unsigned char* raw = gbase + WR_OFF + slot * WTPS * WRAW;  // the stage's copy
        // the stage's keys (the score wgmmas of stage i - 1 are done: waited there) and its values into buffer
        // i & 1 (the P.V of stage i - 2 read it, done: waited at i - 1)
        const u32 vf = base + WF_OFF + (i & 1) * WTPS * WVF;
        wg_convert(gbase + WK_OFF, gbase + (vf - base), raw, L, nt, tok0, k.seq_len);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();  // the operands are written, the stage's copy is read: refilled with stage i + WSTAGES
        if (w == 0 && i + WSTAGES < k.nst)
            wg_produce(TM, bt, base + WR_OFF, full, i + WSTAGES, k.t_begin, k.t_end, k.hk, lane, pg_lane, cache0);

        float sc[WN / 2];
        wg_scores(sc, o, R.qa, base + WK_OFF);  // (and the previous stage's P.V: waited)
        u32 pa[WTPS][4];
        float f0, f1;
        wg_softmax(sc, pa, f0, f1, st, R, tok0, t4);
        wg_attend(o, pa, f0, f1, vf);  // in flight until the next stage's wait
    }
    wg_wait0();
    wg_keep(o);
    if (R.active) wg_store(o, st, R, k.b, k.hk, k.s, S, t4, MID_O, MID_L);
}
#else
// Warp-specialised: warpgroup 0 converts, warpgroup 1 multiplies. Warpgroup 0 (WREG_DQ registers) streams the
// split's tiles into the ring of copies (its warp 0 issues them) and converts each stage into the next free slot
// of a ring of WFST f16 stages (keys then values), released by warpgroup 1 (WREG_MMA registers) once the stage's
// P.V is done. Barriers: full[WSTAGES] (the copies), kfull[WFST] (a converted stage: one arrival after the
// converting warpgroup's named barrier), kempty[WFST] (its MMAs are done: one arrival a warp of warpgroup 1).
extern "C" __global__ void __launch_bounds__(256, WMINB) tq_k8v4_verify_ws(
    const TmaMap* __restrict__ TM, const unsigned short* __restrict__ Q,
    const int* __restrict__ BT, const int* __restrict__ SL, float* __restrict__ MID_O, float* __restrict__ MID_L,
    float qk_scale, int S, int min_tiles, long long q_st, long long q_sh, long long bt_sb)
{
    extern __shared__ __align__(1024) unsigned char wsm[];
    unsigned char* gbase;
    const u32 base = wg_base(wsm, gbase);
    const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3;
    const WgBlock k = wg_block(SL, S, min_tiles);
    if (!k.live) return;  // (the whole block)
    const u32 full = base + WS_B_OFF, kfull = full + 8 * WSTAGES, kempty = kfull + 8 * WFST;
    if (tid == 0) wg_barriers<WFST>(full, TM);
    __syncthreads();
    if (tid < 128) {  // warpgroup 0: copies and conversion
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WREG_DQ));
        const int* bt = BT + (long long)k.b * bt_sb;
        int pg_lane = 0, cache0 = -32;
        if (w == 0) wg_fill(TM, bt, base + WS_R_OFF, full, k, lane, pg_lane, cache0);
        const WgLane L = wg_lane(tid, (HS * k.hk) & 15, (u32)min_tiles >> 31);
        for (int i = 0; i < k.nst; ++i) {
            const int slot = i % WSTAGES, fs = i % WFST;
            const int T0 = k.t_begin + i * WTPS, nt = min(WTPS, k.t_end - T0);
            mbar_wait(full + 8 * slot, (i / WSTAGES) & 1);
            const unsigned char* raw = gbase + WS_R_OFF + slot * WTPS * WRAW;
            unsigned char* f16 = gbase + fs * WS_STAGE;
            if (i >= WFST) mbar_wait(kempty + 8 * fs, (i / WFST - 1) & 1);  // stage i - WFST's MMAs are done
            wg_convert(f16, f16 + WTPS * WKT, raw, L, nt, 16 * T0, k.seq_len);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync 1, 128;\n" ::: "memory");  // the stage is converted, its copy read
            if (tid == 0) mbar_arrive(kfull + 8 * fs);
            if (w == 0 && i + WSTAGES < k.nst)
                wg_produce(TM, bt, base + WS_R_OFF, full, i + WSTAGES, k.t_begin, k.t_end, k.hk, lane, pg_lane,
                           cache0);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WREG_MMA));
    const int t4 = lane & 3;
    WgQuery R;
    wg_query(R, Q, k, w, lane, qk_scale, q_st, q_sh);
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    WgRows st = {EMPTY_LSE, EMPTY_LSE, 0.f, 0.f};
    for (int i = 0; i < k.nst; ++i) {
        const int fs = i % WFST;
        const u32 f16 = base + fs * WS_STAGE;
#if WEARLY
        if (i > 0) {  // stage i - 1's P.V is done: its slot is free before stage i is awaited
            wg_wait0();
            wg_keep(o);
            if (lane == 0) mbar_arrive(kempty + 8 * ((i - 1) % WFST));
        }
#endif
        mbar_wait(kfull + 8 * fs, (i / WFST) & 1);
        float sc[WN / 2];
        wg_scores(sc, o, R.qa, f16);  // (waits for stage i - 1's P.V too, where WEARLY did not)
#if !WEARLY
        if (i > 0 && lane == 0) mbar_arrive(kempty + 8 * ((i - 1) % WFST));
#endif
        u32 pa[WTPS][4];
        float f0, f1;
        wg_softmax(sc, pa, f0, f1, st, R, 16 * (k.t_begin + i * WTPS), t4);
        wg_attend(o, pa, f0, f1, f16 + WTPS * WKT);
    }
    wg_wait0();
    wg_keep(o);
    if (R.active) wg_store(o, st, R, k.b, k.hk, k.s, S, t4, MID_O, MID_L);
}
#endif
