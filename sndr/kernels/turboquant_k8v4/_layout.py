"""Byte layout of one TurboQuant k8v4 cache slot (one token, one KV head).

vLLM 0.32.0 (``TurboQuantConfig`` with key_quant_bits=8, value_quant_bits=4)::

    [0, D)                  key: fp8 e4m3 bytes (e4nv on sm_89+)
    [D, D + D/2)            value: 4-bit codes, element 2i in the low nibble
                            of byte i, element 2i+1 in the high nibble
    [D + D/2, +2)           value scale, fp16 little endian
    [D + D/2 + 2, +2)       value zero (the vector's min), fp16 little endian
    [slot_size, aligned)    padding to an even size (never written)

The cache tensor is ``[num_blocks, block_size, num_kv_heads, slot_aligned]``
uint8, contiguous (vLLM's LBNHC layout after the backend's transpose).
Pure Python: no torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_MAX = 448.0  # e4m3 (e4nv) largest finite value; casts saturate here
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


def workspace_numel(batch: int, num_heads: int, head_dim: int, num_splits: int) -> int:
    """float32 elements of split-KV scratch: partial outputs [B, Hq, S, D] then their LSEs [B, Hq, S]."""
    return batch * num_heads * num_splits * (head_dim + 1)


@dataclass(frozen=True)
class Layout:
    head_dim: int

    @property
    def key_bytes(self) -> int:
        return self.head_dim

    @property
    def value_data_bytes(self) -> int:
        return (self.head_dim * 4 + 7) // 8

    @property
    def scale_offset(self) -> int:
        return self.key_bytes + self.value_data_bytes

    @property
    def zero_offset(self) -> int:
        return self.scale_offset + 2

    @property
    def slot_size(self) -> int:
        return self.key_bytes + self.value_data_bytes + 4

    @property
    def slot_size_aligned(self) -> int:
        s = self.slot_size
        return s + (s % 2)


def slot_size_aligned(head_dim: int) -> int:
    return Layout(head_dim).slot_size_aligned
