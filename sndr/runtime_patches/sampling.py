"""PR0001: check top-k/top-p parameter tensors against the logits they mask."""

from __future__ import annotations

from collections.abc import Callable

from . import argument, wraps_original


def check_top_k_top_p(logits, k, p) -> None:
    """Raise ValueError when ``k``/``p`` cannot be one value per row of ``logits``.

    The Triton top-k/top-p kernel reads ``k[row]`` and ``p[row]`` for every
    row of ``logits`` without bounds checks: a shorter tensor is an
    out-of-bounds read (garbage thresholds, silently), a tensor on another
    device an illegal address. Only shape and device metadata are read: no
    device synchronisation.
    """
    if logits.dim() != 2:
        raise ValueError(f"top-k/top-p: logits must be (num_rows, vocab_size), got {tuple(logits.shape)}")
    rows = logits.shape[0]
    for name, t in (("k", k), ("p", p)):
        if t is None:
            continue
        if t.dim() != 1 or t.shape[0] != rows:
            raise ValueError(
                f"top-k/top-p: {name} has shape {tuple(t.shape)}, expected ({rows},): one value per "
                f"row of logits {tuple(logits.shape)}"
            )
        if t.device != logits.device:
            raise ValueError(f"top-k/top-p: {name} is on {t.device}, logits on {logits.device}")


def wrap_apply_top_k_top_p(original: Callable) -> Callable:
    """Wrapper factory for ``vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p``."""

    @wraps_original(original)
    def apply_top_k_top_p(*args, **kwargs):
        logits = argument(args, kwargs, 0, "logits")
        k = argument(args, kwargs, 1, "k")
        p = argument(args, kwargs, 2, "p")
        if k is not None or p is not None:
            check_top_k_top_p(logits, k, p)
        return original(*args, **kwargs)

    return apply_top_k_top_p
