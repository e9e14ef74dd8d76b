"""sndr: a transactional text-patch engine with anchor drift detection for pinned vLLM trees.

The public surface, in one place:

- models: :class:`Patch`, :class:`Edit`, :class:`FileEdits`, :class:`RuntimeEdit`,
  :class:`Verdict`, :class:`Ledger`, :class:`Report`
- loading: :func:`load_patch_set`, :func:`parse_patch`
- the one classifier: :func:`classify_edit`
- planning (pure): :func:`build_plan`, :func:`gate`
- effects: :func:`run_apply`, :func:`run_verify`, :func:`run_revert`
- trees: :func:`open_tree`
- errors: :class:`SndrError`, :class:`Problem`
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The vLLM version the shipped patch set is validated on.
PIN_VERSION = "0.32.0"

_LAZY = {
    "Patch": "sndr.model", "Edit": "sndr.model", "FileEdits": "sndr.model", "RuntimeEdit": "sndr.model",
    "Verdict": "sndr.model", "Ledger": "sndr.model", "Report": "sndr.model",
    "load_patch_set": "sndr.load", "parse_patch": "sndr.load",
    "classify_edit": "sndr.classify",
    "build_plan": "sndr.plan", "gate": "sndr.plan",
    "run_apply": "sndr.apply", "run_verify": "sndr.apply", "run_revert": "sndr.apply",
    "open_tree": "sndr.tree",
    "SndrError": "sndr.errors", "Problem": "sndr.errors",
}

__all__ = sorted(_LAZY) + ["PIN_VERSION", "__version__"]


def __getattr__(name: str):
    # Lazy: the startup hook imports ``sndr`` in every vLLM process and must stay cheap.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sndr' has no attribute {name!r}")
