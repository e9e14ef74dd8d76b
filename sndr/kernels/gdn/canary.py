"""PK0003's canary (:mod:`sndr.kernels.canary`): the fused GDN step on a small fixed problem vs float64.

At the first eager call of a shape in a process (key heads H, value heads HV, K, V,
state dtype, T and which entry: the MTP op's call or the packed decode + norm), the
fused step runs three requests of T tokens (accepted counts T, 1 and 2, seeded inputs,
random distinct slots) through the same launch flags as the entry, and its normed
outputs and every written state are compared with the float64 recurrence + gated
RMSNorm (``reference.post_conv_mtp_dense``). Tolerance: relative L2 :data:`TOLERANCE`
(about 2.3e-3 measured from the bf16 output rounding; a wrong kernel is off by order 1).
A first call inside a CUDA-graph capture is ``canary_skipped`` for that call (vLLM's
kernel is captured for it; vLLM warms every graph size up eagerly first).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import _cudart
from .. import canary as _canary

PK0003 = "PK0003"
TOLERANCE = 2e-2
_HERE = Path(__file__).resolve().parent
_OK: dict[tuple, bool] = {}


def kernel_hash() -> str:
    """sha256 of this package's kernel and launch code (every ``.py``, ``.cu`` and ``.cuh`` here)."""
    return _canary.package_hash(_HERE, (".py", ".cu", ".cuh"))


def problem(h: int, hv: int, k: int, v: int, state_dtype: torch.dtype, t: int, seed: int = 20261201) -> dict:
    """The fixed problem on the CPU: three requests of ``t`` tokens in a pool of 3 t + 1 slots."""
    g = torch.Generator().manual_seed(seed)
    n, tok = 3, 3 * t
    bf = torch.bfloat16
    slots = n * t + 1
    width = 2 * h * k + hv * v
    qkvz = torch.randn(tok, width + hv * v, generator=g).to(bf)
    ba = torch.randn(tok, 2 * hv, generator=g).to(bf)
    return {
        "state": (torch.randn(slots, hv, v, k, generator=g) * 0.3).to(state_dtype),
        "idx": (torch.randperm(slots - 1, generator=g)[: n * t] + 1).reshape(n, t).to(torch.int32),
        "num_acc": torch.tensor([t, 1, min(2, t)], dtype=torch.int32),
        "cu": torch.arange(0, tok + 1, t, dtype=torch.int32),
        "mixed": qkvz[:, :width], "gate": qkvz[:, width:].view(tok, hv, v),
        "b": ba[:, :hv], "a": ba[:, hv:],
        "A_log": torch.rand(hv, generator=g) * 2 - 1, "dt_bias": torch.rand(hv, generator=g) * 2 - 1,
        "w": (torch.rand(v, generator=g) + 0.5).to(bf),
    }


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.double()
    den = float(ref.norm())
    return float((x - ref).norm()) / (den if den > 0 else 1.0)


def step_check(h: int, hv: int, k: int, v: int, state_dtype: torch.dtype, t: int, decode: bool,
               device: torch.device | str, kernel: str = "triton", shape: str | None = None) -> tuple[float, float]:
    """The fused step of one entry (``decode``: the packed decode + norm, T = 1) on the fixed problem,
    on ``device``, through ``kernel`` (``"triton"``: ``kernels.gdn_step``; ``"cuda"``: ``cuda_step`` at launch
    shape ``shape``, a ``CudaConfig.label``, default its pick): (the larger relative error of outputs and
    written states vs float64, :data:`TOLERANCE`)."""
    from . import cuda_step, kernels, reference

    p = problem(h, hv, k, v, state_dtype, 1 if decode else t)
    eps, scale = 1e-6, k**-0.5
    acc = torch.ones_like(p["num_acc"]) if decode else p["num_acc"]
    st64 = p["state"].double()
    want = reference.post_conv_mtp_dense(p["mixed"], p["a"], p["b"], p["A_log"], p["dt_bias"], p["idx"], acc, st64,
                                         p["gate"], p["w"], scale, eps, "silu")
    d = {name: x.to(device) for name, x in p.items()}
    out = torch.empty(d["gate"].shape, dtype=torch.bfloat16, device=device)
    if kernel == "cuda":
        idx = d["idx"][:, 0].contiguous() if decode else d["idx"]
        step = cuda_step.CudaStep(d["mixed"], d["a"], d["b"], d["A_log"], d["dt_bias"], out, d["state"], idx,
                                  d["gate"], d["w"], n_req=3, spec=not decode, scale=scale, norm_eps=eps,
                                  sigmoid_gate=False, acc=None if decode else d["num_acc"],
                                  cu=None if decode else d["cu"],
                                  cfg=cuda_step.CudaConfig.parse(shape) if shape else
                                  cuda_step.pick_config(3, hv, v, k, state_dtype, 1 if decode else t))
        if not step(d["mixed"], d["a"], d["b"], d["A_log"], d["dt_bias"], out, d["state"], idx, d["gate"], d["w"],
                    None if decode else d["num_acc"], None if decode else d["cu"]):
            raise RuntimeError("the CUDA step refused the canary's pool")
    elif decode:
        kernels.gdn_step(d["mixed"], None, None, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"],
                         d["idx"][:, 0].contiguous(), out, scale=scale, n_seqs=3, output_gate=d["gate"],
                         norm_weight=d["w"], norm_eps=eps)
    else:
        kernels.gdn_step(d["mixed"], None, None, d["a"], d["b"], d["A_log"], d["dt_bias"], d["state"], d["idx"], out,
                         scale=scale, n_seqs=3, tokens_per_seq=t, cu_seqlens=d["cu"], num_accepted_tokens=d["num_acc"],
                         idx_tok_stride=1, output_gate=d["gate"], norm_weight=d["w"], norm_eps=eps,
                         strict_accepted=True)
    written = p["idx"].reshape(-1).long()
    err = max(_rel(out, want), _rel(d["state"][written.to(d["state"].device)].float(), st64[written]))
    return err, TOLERANCE


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):
        return False


def step_ok(state: torch.Tensor, h: int, t: int, decode: bool, kernel: str = "triton",
            shape: str | None = None) -> bool | None:
    """PK0003: may the fused step (``kernel``: ``"triton"`` or ``"cuda"`` at launch shape ``shape``) serve
    calls of this shape on ``state``'s CUDA device?

    One dict lookup once the verdict is known; the first eager call of a shape runs the
    canary. None: not known yet and this call is inside a CUDA-graph capture (skipped for
    this call; vLLM's kernel is captured)."""
    idx = _cudart.device_index(state)
    hv, v, k = state.shape[1], state.shape[2], state.shape[3]
    key = (idx, decode, h, hv, k, v, state.dtype, t, kernel, shape)
    hit = _OK.get(key)
    if hit is not None:
        return hit

    what = ("packed decode + norm" if decode else f"MTP T={t}") + (f" (CUDA step {shape})" if kernel == "cuda" else "")
    config = f"{what} H={h} HV={hv} K={k} V={v} {str(state.dtype).replace('torch.', '')} state"
    ident, device = _canary.identity(idx)
    if _capturing():
        _canary.skip_in_capture(PK0003, config, device)
        return None
    dev = torch.device("cuda", idx)
    with torch.cuda.device(idx):
        result = _canary.check(PK0003, config, device=device, identity=ident, kernel_hash=kernel_hash(),
                               run=lambda: step_check(h, hv, k, v, state.dtype, t, decode, dev, kernel, shape))
    _OK[key] = result.ok
    return result.ok


def reset() -> None:
    _OK.clear()
