"""Load vLLM kernel files copied into ``.baselines/`` under stub modules, without importing vLLM.

Shared by the TurboQuant and GDN baseline loaders (tests and benchmarks only).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def load_with_stubs(pkg: str, src: Path, files: tuple[str, ...],
                    stubs: dict[str, types.ModuleType]) -> dict[str, types.ModuleType]:
    """Execute ``src/<file>`` as ``<pkg>.<file stem>`` for each of ``files`` with ``stubs`` in
    ``sys.modules``; every entry it touched is restored afterwards. Returns stem -> module."""
    names = list(stubs) + [f"{pkg}.{f[:-3]}" for f in files]
    saved = {n: sys.modules.get(n) for n in names}
    loaded: dict[str, types.ModuleType] = {}
    try:
        sys.modules.update(stubs)
        for f in files:
            name = f"{pkg}.{f[:-3]}"
            spec = importlib.util.spec_from_file_location(name, src / f)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {src / f} as a module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            loaded[f[:-3]] = mod
    finally:
        for n, old in saved.items():
            if old is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = old
    return loaded
