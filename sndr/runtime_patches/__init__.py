"""Replacement callables of the shipped runtime patches (``patches/PR*.toml``).

Each module here is named by a ``[[runtime]]`` entry as
``sndr.runtime_patches.<module>:<function>``. The shipped ones wrap
(``wrap = true``): the runtime calls ``function(original)`` and installs what
it returns, so vLLM's own implementation still does the work and the patch
only adds a check in front of it.

Nothing here imports torch or vLLM at import time: sndr's core must stay
importable without them, and the wrappers only read shape metadata of the
tensors they are handed.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["argument", "lazy_module", "module_globals", "wraps_original"]


def argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """The value of parameter ``name`` (position ``index``) in a call, or ``default``."""
    if name in kwargs:
        return kwargs[name]
    if index < len(args):
        return args[index]
    return default


def wraps_original(original: Callable) -> Callable[[Callable], Callable]:
    """``functools.wraps`` that also marks the wrapper as sndr's.

    ``__wrapped__`` keeps ``inspect.signature`` of the wrapper equal to the
    original's, so the runtime's live signature check and any caller that
    introspects the function see vLLM's signature.
    """

    def decorate(wrapper: Callable) -> Callable:
        wrapped: Any = functools.wraps(original)(wrapper)
        wrapped.__sndr_wraps__ = original
        return wrapped

    return decorate


def module_globals(original: Callable) -> dict[str, Any]:
    """The module globals of the function ``original`` finally wraps: through every sndr wrapper of a
    chain (``__sndr_wraps__``) to vLLM's own function, whose module a wrapper that re-implements part of a
    method must read names from (a wrapper's ``__globals__`` would be sndr's module)."""
    inner: Any = original
    while getattr(inner, "__sndr_wraps__", None) is not None:
        inner = inner.__sndr_wraps__
    return getattr(inner, "__globals__", {})


def lazy_module(module: str, patch: str, unavailable: str, fallback: str) -> Callable[[], Any]:
    """A loader of the kernel-side ``module`` for a patch's wrappers: imported at the loader's first
    call (installing the patch imports nothing), then the module, or False where it cannot be imported
    (no torch / triton), that reason logged once as ``sndr PATCH: UNAVAILABLE (error); FALLBACK``."""
    loaded: dict[str, Any] = {}

    def load() -> Any:
        mod = loaded.get("m")
        if mod is None:
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                logging.getLogger("sndr.kernels").warning(
                    "sndr %s: %s (%s); %s (logged once)", patch, unavailable, exc, fallback)
                mod = False
            loaded["m"] = mod
        return mod

    return load
