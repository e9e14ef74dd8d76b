"""The Triton store of the TurboQuant k8v4 cache: quantize key/value rows into their slots.

fp8 e4m3 keys (round to nearest even, saturating) and 4-bit values with a per-slot
scale and zero; the slot layout is ``_layout``. ``check_cache`` is the one check of a
cache tensor's shape and strides that the decode and verify entries share.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._layout import FP8_MAX, Layout

FP8_MAX_C = tl.constexpr(FP8_MAX)


@triton.jit
def _e4m3_rtne_bits(x):
    """float32 -> fp8 e4m3 (e4nv) bits, round to nearest even, saturating at +-448.

    The same bits as the hardware ``cvt.rn.satfinite.e4m3x2.f32`` that
    ``x.to(tl.float8e4nv)`` compiles to on sm_89+, computed with integer ops
    so that Triton's interpreter (whose fp8 cast mis-rounds, e.g. 1.97 -> 1.0)
    gives them too. NaN is not supported.
    """
    x = tl.minimum(tl.maximum(x, -FP8_MAX_C), FP8_MAX_C)
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    a = tl.abs(x)
    ab = a.to(tl.int32, bitcast=True)
    r = ab + 0x7FFFF + ((ab >> 20) & 1)  # round the fp32 mantissa to 3 bits; a carry bumps the exponent
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)  # rebias 127 -> 7
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # below 2**-6: multiples of 2**-9, RTNE
    return (tl.where(a < 0.015625, sub, normal) | sign).to(tl.uint8)


@triton.jit
def _store_kernel(
    K, V, KV8, KV16, SLOT,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_blk, stride_pos, stride_head,  # cache strides, bytes
    H: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
):
    n = tl.program_id(0)
    slot = tl.load(SLOT + n).to(tl.int64)
    if slot < 0:  # padding token
        return
    h = tl.arange(0, BLOCK_H)
    hm = h < H
    d = tl.arange(0, D)
    base = (slot // PAGE) * stride_blk + (slot % PAGE) * stride_pos + h.to(tl.int64) * stride_head

    k = tl.load(K + n * stride_kn + h[:, None] * stride_kh + d[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
    kb = _e4m3_rtne_bits(k)
    tl.store(KV8 + base[:, None] + d[None, :], kb, mask=hm[:, None])

    # same float32 expressions as vLLM 0.32.0's _store_quantized_value (VQB=4): same bytes
    v = tl.load(V + n * stride_vn + h[:, None] * stride_vh + d[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
    vmin = tl.min(v, axis=1)
    vmax = tl.max(v, axis=1)
    sc = (vmax - vmin) / 15.0
    sc = tl.where(sc > 1e-8, sc, 1e-8)
    q = tl.minimum(tl.maximum(((v - vmin[:, None]) / sc[:, None] + 0.5).to(tl.int32), 0), 15)
    lo, hi = tl.split(tl.reshape(q, [BLOCK_H, D // 2, 2]))
    packed = ((lo & 0xF) | ((hi & 0xF) << 4)).to(tl.uint8)
    j = tl.arange(0, D // 2)
    tl.store(KV8 + base[:, None] + D + j[None, :], packed, mask=hm[:, None])
    meta = (base + D + D // 2) // 2  # fp16 index of the scale
    tl.store(KV16 + meta, sc.to(tl.float16), mask=hm)
    tl.store(KV16 + meta + 1, vmin.to(tl.float16), mask=hm)



def store(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize [N, H, D] key/value into kv_cache [blocks, page, H, slot] uint8.

    Byte-identical to vLLM 0.32.0's ``triton_turboquant_store(key_fp8=True,
    value_quant_bits=4)`` on sm_89+ (keys beyond +-448 saturate, as there).
    """
    n, h, d = key.shape
    if n == 0:
        return
    check_cache(kv_cache, d, h)
    kv16 = kv_cache.view(torch.float16)
    _store_kernel[(n,)](
        key, value, kv_cache, kv16, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        H=h, BLOCK_H=triton.next_power_of_2(h), D=d, PAGE=kv_cache.shape[1],
        num_warps=4,
    )


def check_cache(kv_cache: torch.Tensor, d: int, hk: int) -> None:
    lay = Layout(d)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4:
        raise ValueError(f"kv_cache must be uint8 [blocks, page, Hk, slot], got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    if kv_cache.shape[2] != hk or kv_cache.shape[3] < lay.slot_size:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} does not hold Hk={hk} slots of {lay.slot_size} bytes")
    if d & (d - 1) or not 16 <= d <= 512:
        raise ValueError(f"head_dim {d} must be a power of two in [16, 512]")
    if kv_cache.stride(3) != 1 or any(kv_cache.stride(i) % 4 for i in range(3)):
        raise ValueError(f"kv_cache strides {kv_cache.stride()} must be multiples of 4 bytes, innermost 1")
