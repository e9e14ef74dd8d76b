"""Plugin modules that ship code (kernels) wired into vLLM by runtime patches.

Each subpackage imports torch and triton lazily: sndr's core install has neither.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attrs(package: str, table: Mapping[str, str | None]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for a kernel package: ``table`` maps each public name to the
    submodule that defines it (``".kernels"``), or to None for a submodule exported under its own name.
    The submodule (and so torch / triton) is imported on the first access, and the value is cached in
    the package's namespace."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = table[name]
        if home is None:
            value = importlib.import_module(f".{name}", package)
        else:
            value = getattr(importlib.import_module(home, package), name)
        vars(importlib.import_module(package))[name] = value
        return value

    return __getattr__
