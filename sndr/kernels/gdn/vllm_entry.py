"""Drop-ins for vLLM 0.32.0's two GDN decode kernels, on sndr's fused step.

* :func:`try_packed_decode` takes the arguments of
  ``fused_recurrent_gated_delta_rule_packed_decode`` (plain decode, one token
  per sequence, q/k/v packed in ``mixed_qkv``);
* :func:`try_sigmoid_gating_update` takes those of
  ``fused_sigmoid_gating_delta_rule_update`` (spec verify with per-token
  snapshots and ``num_accepted_tokens``; also vLLM's non-packed decode).

Each returns vLLM's result (same tensors, same in-place state writes) when
sndr's kernel takes the call, and ``None`` when it does not (another state
dtype, ROCm, no Triton, a CPU tensor outside the interpreter, KDA gating,
``inplace_final_state=False``, ...): the caller then runs vLLM's own function.
The first refusal of each kind is logged once. Patch PK0003
(``sndr.runtime_patches.gdn``) installs wrappers that do exactly that.

On CUDA, the entries of vLLM's default path (:func:`try_post_conv_mtp`,
:func:`try_packed_decode_norm`) take a call only in the cells where sndr measured
faster than vLLM's default path (``routing``: state dtype, batch, T, graph capture
or eager), and, on by default, only on the measured GPU class (sm_90); the Triton
fallback entries only with ``SNDR_ENABLE_PK0003=1``.

Differences from vLLM, all outside what vLLM's callers read: output rows of a
padded sequence (state slot <= 0) are zeros where vLLM's spec path leaves
``torch.empty`` memory; ``num_accepted_tokens`` below 1 is read as 1 (vLLM
would read the column before the row). Like vLLM, column ``t`` of a 2-D
index tensor is read at ``row + t``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, TypeAlias, TypeVar, cast

import torch

from .. import _cudart

if TYPE_CHECKING:
    from .cuda_step import CudaStep
    from .kernels import Plan

LOG = logging.getLogger("sndr.kernels")
_LOGGED: set[str] = set()
_SCOPE: dict[str, bool] = {}  # "explicit": SNDR_ENABLE_PK0003=1 (read once per process)
_STATE_DTYPES = (torch.float32, torch.bfloat16)
_IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_K = {"kernels": None}


def _refuse(fn: str, why: str) -> Literal[False]:
    key = f"{fn}:{why}"
    if key not in _LOGGED:
        _LOGGED.add(key)
        LOG.warning("sndr PK0003: %s falls through to vLLM's own kernel: %s (logged once)", fn, why)
    return False


def _explicit() -> bool:
    ex = _SCOPE.get("explicit")
    if ex is None:
        from . import routing

        ex = _SCOPE["explicit"] = routing.explicit_opt_in()
    return ex


def _scope_why(t: torch.Tensor, default_path: bool) -> str | None:
    """None where PK0003's scope takes a CUDA call on ``t``'s device (CPU: the interpreter's tests), else why not.

    ``default_path``: an entry of vLLM's default path (the measured GPU class, unless
    opted in explicitly); else a Triton fallback entry (only opted in explicitly)."""
    if t.device.type != "cuda":
        return None
    from . import routing

    if routing._MEASURING[-1]:
        return None
    if not default_path:
        if _explicit():
            return None
        return ("vLLM's Triton fallback kernels are outside the measured default set; SNDR_ENABLE_PK0003=1 "
                "takes them")
    why = _cudart.device_refusal(t, (0, 0), "")  # (ROCm: not a CUDA device)
    if why:
        return why
    return routing.capability_why(_cudart.capability(_cudart.device_index(t)), _explicit())


# cell verdicts per (plan key, mode): True taken, False refused (logged once per reason)
_CELLS: dict[tuple, bool] = {}
# the kernel a taken cell runs per (plan key, mode): "cuda" (step.cu) or "triton" (routing.CUDA)
_KERNEL: dict[tuple, str] = {}
# the CUDA step of a plan key (cuda_step.CudaStep), or None where cuda_step.why_not refused it (logged once)
_CUDA_STEPS: dict[tuple, object] = {}


def _mode() -> str:
    return "graph" if torch.cuda.is_current_stream_capturing() else "eager"


def _cuda_step(key: tuple | None, build):
    """The CUDA step of this call layout (built once per key), or None (the Triton step runs)."""
    step = _CUDA_STEPS.get(key, False) if key is not None else False
    if step is False:
        step = build()
        if key is not None:
            if len(_CUDA_STEPS) >= _MAX_PLANS:
                _CUDA_STEPS.clear()
            _CUDA_STEPS[key] = step
    return step


def _pick_kernel(state: torch.Tensor, mode: str, n: int, t: int, key: tuple | None, build) -> str:
    """``"cuda"`` where the routing table routes this cell to the CUDA step and it takes the call, else
    ``"triton"`` (CPU tensors, the interpreter: always Triton)."""
    if state.device.type != "cuda" or build is None:
        return "triton"
    from . import routing

    kernel = routing.kernel_for(str(state.dtype).replace("torch.", ""), mode, n, t)
    if kernel == "cuda" and _cuda_step(key, build) is None:
        return "triton"
    return kernel


def _chosen_kernel(key: tuple | None, state: torch.Tensor, n: int, t: int, build) -> str:
    """The kernel of a call :func:`_cell_taken` took: its cached choice, else chosen now."""
    if state.device.type != "cuda":
        return "triton"
    from . import routing

    mode = _mode()
    hit = _KERNEL.get((key, mode)) if key is not None and not routing._MEASURING[-1] else None
    return hit or _pick_kernel(state, mode, n, t, key, build)


def _cell_taken(fn: str, key: tuple | None, plan: Plan, state: torch.Tensor, n: int, t: int, decode: bool,
                build=None) -> bool:
    """Whether the measured cells take this CUDA call (``n`` requests, ``t`` tokens each) now, and
    PK0003's canary passed for its shape and routed kernel (``sndr.kernels.gdn.canary``). ``build``:
    makes the call layout's CUDA step (None where it has none)."""
    if state.device.type != "cuda":
        return True
    from . import routing

    if routing._MEASURING[-1]:
        return True
    mode = _mode()
    ck = (key, mode)
    ok = _CELLS.get(ck) if key is not None else None
    if ok is None:
        dtype = str(state.dtype).replace("torch.", "")
        why = routing.cell_why(dtype, mode, n, t)
        # vLLM runs each CUDA-graph size eagerly once before it captures it. Where only the graph cell
        # wins, that first eager call of the layout runs sndr's step (the kernel the graph cell routes),
        # so that its kernel is compiled and its canary has passed before the capture (no compile inside
        # a capture); later eager calls of the layout keep vLLM's path.
        warm = bool(why) and mode == "eager" and key is not None and routing.cell_why(dtype, "graph", n, t) is None
        if why:
            _refuse(fn, why)
        if why and not warm:
            ok = False
        else:
            from . import canary

            if (mode == "graph" and build is not None and key not in _CUDA_STEPS
                    and routing.kernel_for(dtype, mode, n, t) == "cuda"):
                # the CUDA step of this layout is not built yet: no NVRTC compile or module load inside a
                # capture; vLLM's kernel is captured for this call (not remembered; vLLM warms every graph
                # size up eagerly first, which builds it)
                return False
            kernel = _pick_kernel(state, "graph" if warm else mode, n, t, key, build)
            shape = None  # the CUDA step's canary runs the launch shape this layout launches
            if kernel == "cuda":
                step = _cuda_step(key, build)
                shape = step.cfg.label() if step is not None else None
            verdict = canary.step_ok(state, plan.consts[0], t, decode, kernel=kernel, shape=shape)
            if verdict is None:  # first call of the shape inside a capture: vLLM's kernel is captured
                return False
            ok = verdict  # a failed canary is logged and attested by sndr.kernels.canary
            if key is not None:
                if len(_KERNEL) >= _MAX_PLANS:
                    _KERNEL.clear()
                _KERNEL[ck] = kernel
        if key is not None:
            if len(_CELLS) >= _MAX_PLANS:
                _CELLS.clear()
            _CELLS[ck] = ok and not warm
    return ok


def _kernels():
    if _K["kernels"] is None:
        from . import kernels  # imports triton

        _K["kernels"] = kernels
    return _K["kernels"]


def _device_ok(t: torch.Tensor) -> str | None:
    """None when sndr's Triton kernel can run on ``t``'s device, else why not."""
    if t.device.type != "cuda":
        try:
            return None if _kernels().interpreting() else f"{t.device.type} tensors"
        except ImportError:
            return "triton is not importable"
    try:
        _kernels()
    except ImportError:
        return "needs triton and an sm_80+ GPU"
    return _cudart.device_refusal(t, (8, 0), "needs triton and an sm_80+ GPU")


def _state_ok(s: torch.Tensor) -> str | None:
    if s is None:
        return "no initial_state"
    if s.dtype not in _STATE_DTYPES:
        return f"state dtype {s.dtype} (takes float32, bfloat16)"
    if s.dim() != 4:
        return f"state of {s.dim()} dims"
    hv, v, k = s.shape[1], s.shape[2], s.shape[3]
    if s.stride(3) != 1 or s.stride(2) != k or s.stride(1) != v * k:
        return "state rows [HV, V, K] not contiguous"
    if k > 256 or v > 1024 or hv == 0:
        return f"K={k}, V={v} (takes K <= 256, V <= 1024)"
    return None


# Plans per call layout: a key of every shape, stride, dtype and device the
# checks below read, so a hit skips them (an eager decode step calls these
# once per GDN layer). False: refused (already logged); None: run, uncached.
# (kernel plan, whether the tensors are used as they come, output shape [B, T, HV, V])
_SigmoidPlan: TypeAlias = "tuple[Plan, bool, tuple[int, int, int, int]]"
_PlanEntry: TypeAlias = "Plan | _SigmoidPlan | Literal[False]"
_PLANS: dict[tuple, _PlanEntry] = {}
_MAX_PLANS = 4096
_V = TypeVar("_V", bound=_PlanEntry)


def _remember(key: tuple | None, value: _V) -> _V:
    if key is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = value
    return value


class _Strided:
    """Stands for a tensor not allocated yet where a plan only reads its strides."""

    def __init__(self, strides):
        self._s = strides

    def stride(self, i=None):
        return self._s if i is None else self._s[i]


def _layout(t):
    return (t.shape, t.stride(), t.dtype, t.device)


def try_packed_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
):
    """``fused_recurrent_gated_delta_rule_packed_decode`` on sndr's kernel, or None."""
    try:
        key = ("packed", _layout(mixed_qkv), _layout(a), _layout(b), _layout(A_log), _layout(dt_bias),
               _layout(initial_state), _layout(out), _layout(ssm_state_indices), scale, use_qk_l2norm_in_kernel)
    except (AttributeError, TypeError):
        key = None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _remember(key, _packed_plan(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                           ssm_state_indices, use_qk_l2norm_in_kernel))
    if plan is False:
        return None
    _kernels().run_plan(cast("Plan", plan), mixed_qkv, None, None, a, b, A_log, dt_bias, out, initial_state,
                        ssm_state_indices, cache_key=key)  # a "packed" key holds only kernel plans
    return out, initial_state


def _packed_args_why(mixed_qkv, a, b, A_log, dt_bias, state, ssm_state_indices) -> str | None:
    """Why sndr does not take a packed-decode call's common arguments (state, device, layout, shapes,
    activation dtype), or None; shared by the plain packed decode and the packed decode + norm."""
    why = _state_ok(state) or _device_ok(mixed_qkv)
    if why:
        return why
    hv, vd, kd = state.shape[1], state.shape[2], state.shape[3]
    if (mixed_qkv.dim() != 2 or mixed_qkv.stride(1) != 1 or a.dim() != 2 or b.dim() != 2
            or a.stride(1) != 1 or b.stride(1) != 1 or ssm_state_indices.dim() != 1
            or A_log.dim() != 1 or dt_bias.dim() != 1 or A_log.stride(0) != 1 or dt_bias.stride(0) != 1):
        return "argument layout vLLM rejects"  # vLLM raises its own error
    n = mixed_qkv.shape[0]
    qk = mixed_qkv.shape[1] - hv * vd
    h = qk // (2 * kd) if qk > 0 else 0
    if (h <= 0 or qk != 2 * h * kd or hv % h or a.shape != (n, hv) or b.shape != (n, hv)
            or ssm_state_indices.shape[0] != n or A_log.shape[0] != hv or dt_bias.shape[0] != hv):
        return "argument shapes vLLM rejects"
    if mixed_qkv.dtype not in _IO_DTYPES:
        return f"dtype {mixed_qkv.dtype}"
    return None


def _packed_plan(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                 use_qk_l2norm_in_kernel) -> Plan | Literal[False]:
    fn = "fused_recurrent_gated_delta_rule_packed_decode"
    why = (_packed_args_why(mixed_qkv, a, b, A_log, dt_bias, initial_state, ssm_state_indices)
           or _scope_why(mixed_qkv, default_path=False))
    if why:
        return _refuse(fn, why)
    n, hv, vd = mixed_qkv.shape[0], initial_state.shape[1], initial_state.shape[2]
    if tuple(out.shape) != (n, 1, hv, vd) or not out.is_contiguous():
        return _refuse(fn, "argument shapes vLLM rejects")
    if out.dtype not in _IO_DTYPES:
        return _refuse(fn, f"dtype {mixed_qkv.dtype} / {out.dtype}")
    dev = mixed_qkv.device
    if any(t.device != dev for t in (a, b, A_log, dt_bias, initial_state, out, ssm_state_indices)):
        return _refuse(fn, "tensors on different devices")
    return _kernels().make_plan(
        mixed_qkv, None, None, a, b, out.view(n, hv, vd), initial_state, ssm_state_indices,
        scale=scale, n_seqs=n, tokens_per_seq=1, l2norm=use_qk_l2norm_in_kernel)


def try_sigmoid_gating_update(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    inplace_final_state: bool = True,
    cu_seqlens: torch.Tensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    is_kda: bool = False,
):
    """``fused_sigmoid_gating_delta_rule_update`` on sndr's kernel, or None."""
    try:
        key = ("sigmoid", _layout(A_log), _layout(a), _layout(b), _layout(dt_bias), _layout(q), _layout(k),
               _layout(v), beta, threshold, scale, _layout(initial_state), inplace_final_state,
               None if cu_seqlens is None else _layout(cu_seqlens), _layout(ssm_state_indices),
               None if num_accepted_tokens is None else _layout(num_accepted_tokens),
               use_qk_l2norm_in_kernel, is_kda)
    except (AttributeError, TypeError):  # a None where a tensor belongs: the checks decide
        key = None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _sigmoid_plan(A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state,
                             inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                             use_qk_l2norm_in_kernel, is_kda)
        if plan is not False and plan[1]:  # views only: safe to replay for this layout
            _remember(key, plan)
        elif plan is False:
            _remember(key, False)
    if plan is False:
        return None
    kplan, cacheable, shape = cast(_SigmoidPlan, plan)  # a "sigmoid" key holds only these
    o = q.new_empty(shape)
    if cacheable:
        _kernels().run_plan(kplan, q, k, v, a, b, A_log, dt_bias, o, initial_state, ssm_state_indices,
                            num_accepted_tokens, cu_seqlens, cache_key=key)
    else:
        tokens, hk, hv = shape[0] * shape[1], q.shape[2], shape[2]
        _kernels().run_plan(kplan, q.reshape(tokens, hk, -1).contiguous(), k.reshape(tokens, hk, -1).contiguous(),
                            v.reshape(tokens, hv, -1).contiguous(), a.reshape(tokens, hv).contiguous(),
                            b.reshape(tokens, hv).contiguous(), A_log, dt_bias, o, initial_state,
                            ssm_state_indices, num_accepted_tokens, cu_seqlens)
    return o, initial_state


def _sigmoid_plan(A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state, inplace_final_state,
                  cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
                  is_kda) -> _SigmoidPlan | Literal[False]:
    """(kernel plan, whether the tensors are used as they come, output shape), or False."""
    fn = "fused_sigmoid_gating_delta_rule_update"
    if is_kda:
        return _refuse(fn, "KDA gating")
    if not inplace_final_state:
        return _refuse(fn, "inplace_final_state=False")
    if ssm_state_indices is None:
        return _refuse(fn, "no ssm_state_indices")
    why = _state_ok(initial_state) or _device_ok(q) or _scope_why(q, default_path=False)
    if why:
        return _refuse(fn, why)
    if k.dim() != 4 or q.shape != k.shape or v.dim() != 4 or v.shape[:2] != k.shape[:2]:
        return _refuse(fn, "q/k/v shapes")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if (HV, V, K) != tuple(initial_state.shape[1:]) or H == 0 or HV % H:
        return _refuse(fn, "head shapes do not match the state")
    if cu_seqlens is not None and B != 1:
        return _refuse(fn, "cu_seqlens with batch > 1")  # vLLM raises
    if scale is None:
        scale = K**-0.5
    elif not scale > 0:
        return _refuse(fn, "scale <= 0")  # vLLM asserts
    if q.dtype not in _IO_DTYPES or v.dtype not in _IO_DTYPES:
        return _refuse(fn, f"dtype {q.dtype}")
    if ssm_state_indices.dim() not in (1, 2) or A_log.dim() != 1 or dt_bias.dim() != 1:
        return _refuse(fn, "index / parameter shapes")
    if a.numel() != B * T * HV or b.numel() != B * T * HV or A_log.numel() != HV or dt_bias.numel() != HV:
        return _refuse(fn, "a/b/A_log/dt_bias sizes")
    if A_log.stride(0) != 1 or dt_bias.stride(0) != 1:
        return _refuse(fn, "A_log/dt_bias not contiguous")
    dev = q.device
    extra = [t for t in (cu_seqlens, num_accepted_tokens) if t is not None]
    if any(t.device != dev for t in (k, v, a, b, A_log, dt_bias, initial_state, ssm_state_indices, *extra)):
        return _refuse(fn, "tensors on different devices")
    tokens = B * T
    views = []
    for t, shp in ((q, (tokens, H, K)), (k, (tokens, H, K)), (v, (tokens, HV, V)), (a, (tokens, HV)),
                   (b, (tokens, HV))):
        r = t.reshape(shp)
        views.append(r if r.stride(-1) == 1 else r.contiguous())
    cacheable = all(r.data_ptr() == t.data_ptr() for r, t in zip(views, (q, k, v, a, b)))
    q3, k3, v3, a2, b2 = views
    o = _Strided((HV * V, V, 1))  # the [B, T, HV, V] output, allocated per call
    if cu_seqlens is not None:
        n_seqs, t_fixed = cu_seqlens.shape[0] - 1, 0
    else:
        n_seqs, t_fixed = B, T
    kplan = _kernels().make_plan(
        q3, k3, v3, a2, b2, o, initial_state, ssm_state_indices, scale=scale, n_seqs=n_seqs, tokens_per_seq=t_fixed,
        varlen=cu_seqlens is not None, spec=num_accepted_tokens is not None, l2norm=use_qk_l2norm_in_kernel,
        sp_beta=beta, sp_threshold=threshold, idx_tok_stride=1)  # vLLM reads column t of the index row at row + t
    return kplan, cacheable, (B, T, HV, V)


# --- vLLM's default path: the fused CUDA MTP op and the packed decode + gated RMSNorm ---

_GATE_ACTS = ("silu", "sigmoid")
_NORM_W_DTYPES = (torch.bfloat16, torch.float32)


def try_post_conv_mtp(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    state: torch.Tensor,
    output_gate: torch.Tensor,
    norm_weight: torch.Tensor,
    out: torch.Tensor | None = None,
    scale: float = 128**-0.5,
    norm_eps: float = 1e-5,
    output_gate_activation: str = "silu",
):
    """``vllm._custom_ops.fused_gdn_decode_post_conv_mtp`` on sndr's kernel (returns ``out``), or None.

    One launch: the spec-verify update of every request (initial state from
    index column ``num_accepted_tokens - 1``, none unless that is in
    [1, columns]; token ``t``'s state to column ``t``; slots <= 0 are
    padding) and the gated RMSNorm of its outputs with ``output_gate``.
    """
    if out is None:
        out = torch.empty_like(output_gate)
    try:
        key = ("mtp", _layout(mixed_qkv), _layout(a), _layout(b), _layout(A_log), _layout(dt_bias),
               _layout(state_indices), _layout(cu_seqlens), _layout(num_accepted_tokens), _layout(state),
               _layout(output_gate), _layout(norm_weight), _layout(out), scale, norm_eps, output_gate_activation)
    except (AttributeError, TypeError):
        key = None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _remember(key, _mtp_plan(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens,
                                        num_accepted_tokens, state, output_gate, norm_weight, out, scale, norm_eps,
                                        output_gate_activation))
    if plan is False:
        return None
    n_req, cols = cu_seqlens.shape[0] - 1, state_indices.shape[1]

    def build():
        return _build_cuda(mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices, output_gate, norm_weight,
                           n_req=n_req, spec=True, scale=scale, norm_eps=norm_eps, act=output_gate_activation,
                           acc=num_accepted_tokens, cu=cu_seqlens, tokens=cols)

    if not _cell_taken("fused_gdn_decode_post_conv_mtp", key, cast("Plan", plan), state, n_req, cols, decode=False,
                       build=build):
        return None
    if _chosen_kernel(key, state, n_req, cols, build) == "cuda" and cast("CudaStep", _cuda_step(key, build))(
            mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices, output_gate, norm_weight,
            num_accepted_tokens, cu_seqlens):
        return out
    _kernels().run_plan(cast("Plan", plan), mixed_qkv, None, None, a, b, A_log, dt_bias, out, state, state_indices,
                        num_accepted_tokens, cu_seqlens, cache_key=key, z=output_gate, norm_w=norm_weight)
    return out


def _build_cuda(mixed_qkv, a, b, A_log, dt_bias, out, state, idx, gate, norm_weight, *, n_req: int, spec: bool,
                scale: float, norm_eps: float, act: str, tokens: int, acc=None, cu=None) -> CudaStep | None:
    """The CUDA step (``cuda_step``) of a call layout the Triton plan took, or None (the reason logged once)."""
    from . import cuda_step

    cfg = cuda_step.pick_config(n_req, state.shape[1], state.shape[2], state.shape[3], state.dtype, tokens)
    tensors = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "out": out,
               "output_gate": gate, "norm_weight": norm_weight, "idx": idx}
    if spec:
        tensors.update(acc=acc, cu=cu)
    why = cuda_step.why_not(state, tensors, cfg)
    if why:
        cuda_step.log_fallback(why)
        return None
    try:
        return cuda_step.CudaStep(mixed_qkv, a, b, A_log, dt_bias, out, state, idx, gate, norm_weight, n_req=n_req,
                                  spec=spec, scale=scale, norm_eps=norm_eps, sigmoid_gate=act == "sigmoid", acc=acc,
                                  cu=cu, cfg=cfg)
    except (RuntimeError, OSError) as exc:  # _cudart.CudaError / CudaUnavailable: NVRTC or the driver refused it
        cuda_step.log_fallback(f"{type(exc).__name__}: {exc}"[:300])
        return None


def _norm_args_why(output_gate, norm_weight, out, n_tok: int, hv: int, vd: int, act) -> str | None:
    if act not in _GATE_ACTS:
        return f"output gate activation {act!r}"
    if (output_gate.dim() != 3 or tuple(output_gate.shape) != (n_tok, hv, vd) or output_gate.stride(2) != 1
            or output_gate.stride(1) != vd):
        return "output_gate layout"
    if out.dim() != 3 or tuple(out.shape) != (n_tok, hv, vd) or not out.is_contiguous():
        return "out layout"
    if norm_weight.dim() != 1 or norm_weight.numel() != vd or norm_weight.stride(0) != 1:
        return "norm weight layout"
    if norm_weight.dtype not in _NORM_W_DTYPES or output_gate.dtype not in _IO_DTYPES or out.dtype not in _IO_DTYPES:
        return f"norm dtypes {norm_weight.dtype} / {output_gate.dtype} / {out.dtype}"
    return None


def _mtp_plan(mixed_qkv, a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state, output_gate,
              norm_weight, out, scale, norm_eps, act) -> Plan | Literal[False]:
    fn = "fused_gdn_decode_post_conv_mtp"
    why = _state_ok(state) or _device_ok(mixed_qkv) or _scope_why(mixed_qkv, default_path=True)
    if why:
        return _refuse(fn, why)
    hv, vd, kd = state.shape[1], state.shape[2], state.shape[3]
    if (mixed_qkv.dim() != 2 or mixed_qkv.stride(1) != 1 or a.dim() != 2 or b.dim() != 2
            or a.stride(1) != 1 or b.stride(1) != 1 or state_indices.dim() != 2 or state_indices.stride(1) != 1
            or cu_seqlens.dim() != 1 or not cu_seqlens.is_contiguous() or num_accepted_tokens.dim() != 1
            or not num_accepted_tokens.is_contiguous() or A_log.dim() != 1 or dt_bias.dim() != 1
            or A_log.stride(0) != 1 or dt_bias.stride(0) != 1):
        return _refuse(fn, "argument layout vLLM's op rejects")
    n_tok = mixed_qkv.shape[0]
    n_req = cu_seqlens.shape[0] - 1
    qk = mixed_qkv.shape[1] - hv * vd
    h = qk // (2 * kd) if qk > 0 else 0
    if (h <= 0 or qk != 2 * h * kd or hv % h or a.shape != (n_tok, hv) or b.shape != (n_tok, hv)
            or A_log.shape[0] != hv or dt_bias.shape[0] != hv or n_req < 0 or state_indices.shape[0] != n_req
            or num_accepted_tokens.shape[0] != n_req):
        return _refuse(fn, "argument shapes vLLM's op rejects")
    if mixed_qkv.dtype not in _IO_DTYPES or state_indices.dtype not in (torch.int32, torch.int64):
        return _refuse(fn, f"dtype {mixed_qkv.dtype} / indices {state_indices.dtype}")
    why = _norm_args_why(output_gate, norm_weight, out, n_tok, hv, vd, act)
    if why:
        return _refuse(fn, why)
    if not scale > 0:
        return _refuse(fn, "scale <= 0")
    dev = mixed_qkv.device
    if any(t.device != dev for t in (a, b, A_log, dt_bias, state_indices, cu_seqlens, num_accepted_tokens, state,
                                     output_gate, norm_weight, out)):
        return _refuse(fn, "tensors on different devices")
    return _kernels().make_plan(
        mixed_qkv, None, None, a, b, out, state, state_indices, scale=scale, n_seqs=n_req,
        tokens_per_seq=state_indices.shape[1], varlen=True, spec=True, l2norm=True,
        idx_tok_stride=state_indices.stride(1), gate=output_gate, norm_eps=norm_eps,
        sigmoid_gate=act == "sigmoid", strict_accepted=True)


def try_packed_decode_norm(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    output_gate: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    activation: str = "silu",
    checked: bool = False,
):
    """vLLM's packed decode (l2norm on) followed by its gated RMSNorm, in one launch; ``out`` or None.

    ``out`` and ``output_gate`` are [tokens, HV, V]; the result equals
    ``fused_recurrent_gated_delta_rule_packed_decode`` then ``layer_norm_fwd``
    (``is_rms_norm``, ``norm_before_gate``, group = V) on that output.
    ``checked``: :func:`packed_decode_norm_ok` just took this call (its cell and canary
    verdict stand; not asked twice).
    """
    try:
        key = ("packed_norm", _layout(mixed_qkv), _layout(a), _layout(b), _layout(A_log), _layout(dt_bias),
               _layout(state), _layout(out), _layout(ssm_state_indices), _layout(output_gate),
               _layout(norm_weight), scale, norm_eps, activation)
    except (AttributeError, TypeError):
        key = None
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _remember(key, _packed_norm_plan(mixed_qkv, a, b, A_log, dt_bias, scale, state, out,
                                                ssm_state_indices, output_gate, norm_weight, norm_eps, activation))
    if plan is False:
        return None
    n = mixed_qkv.shape[0]
    build = _decode_build(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, ssm_state_indices, output_gate,
                          norm_weight, norm_eps, activation)
    if not (checked or _cell_taken("packed decode + gated RMSNorm", key, cast("Plan", plan), state, n, 1,
                                   decode=True, build=build)):
        return None
    if _chosen_kernel(key, state, n, 1, build) == "cuda" and cast("CudaStep", _cuda_step(key, build))(
            mixed_qkv, a, b, A_log, dt_bias, out, state, ssm_state_indices, output_gate, norm_weight):
        return out
    _kernels().run_plan(cast("Plan", plan), mixed_qkv, None, None, a, b, A_log, dt_bias, out, state,
                        ssm_state_indices, cache_key=key, z=output_gate, norm_w=norm_weight)
    return out


def _decode_build(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, idx, gate, norm_weight, norm_eps, act):
    def build():
        return _build_cuda(mixed_qkv, a, b, A_log, dt_bias, out, state, idx, gate, norm_weight,
                           n_req=mixed_qkv.shape[0], spec=False, scale=scale, norm_eps=norm_eps, act=act, tokens=1)

    return build


def packed_decode_norm_ok(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, ssm_state_indices, output_gate,
                          norm_weight, norm_eps, activation="silu") -> bool:
    """Whether ``try_packed_decode_norm`` takes tensors of these layouts (plans and caches; launches nothing)."""
    try:
        key = ("packed_norm", _layout(mixed_qkv), _layout(a), _layout(b), _layout(A_log), _layout(dt_bias),
               _layout(state), _layout(out), _layout(ssm_state_indices), _layout(output_gate),
               _layout(norm_weight), scale, norm_eps, activation)
    except (AttributeError, TypeError):
        return False
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, _packed_norm_plan(mixed_qkv, a, b, A_log, dt_bias, scale, state, out,
                                                ssm_state_indices, output_gate, norm_weight, norm_eps, activation))
    build = _decode_build(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, ssm_state_indices, output_gate,
                          norm_weight, norm_eps, activation)
    return plan is not False and _cell_taken("packed decode + gated RMSNorm", key, cast("Plan", plan), state,
                                             mixed_qkv.shape[0], 1, decode=True, build=build)


def _packed_norm_plan(mixed_qkv, a, b, A_log, dt_bias, scale, state, out, ssm_state_indices, output_gate,
                      norm_weight, norm_eps, act) -> Plan | Literal[False]:
    fn = "packed decode + gated RMSNorm"
    why = (_packed_args_why(mixed_qkv, a, b, A_log, dt_bias, state, ssm_state_indices)
           or _scope_why(mixed_qkv, default_path=True))
    if why:
        return _refuse(fn, why)
    n, hv, vd = mixed_qkv.shape[0], state.shape[1], state.shape[2]
    why = _norm_args_why(output_gate, norm_weight, out, n, hv, vd, act)
    if why:
        return _refuse(fn, why)
    dev = mixed_qkv.device
    if any(t.device != dev for t in (a, b, A_log, dt_bias, state, out, ssm_state_indices, output_gate, norm_weight)):
        return _refuse(fn, "tensors on different devices")
    return _kernels().make_plan(
        mixed_qkv, None, None, a, b, out, state, ssm_state_indices, scale=scale, n_seqs=n, tokens_per_seq=1,
        l2norm=True, gate=output_gate, norm_eps=norm_eps, sigmoid_gate=act == "sigmoid")
