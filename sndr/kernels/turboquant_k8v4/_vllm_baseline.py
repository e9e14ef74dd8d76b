"""Load vLLM's own TurboQuant store and decode (0.32.0 by default, any version on request) from copied source files.

Tests and the benchmark compare against vLLM's shipped kernels without
importing vLLM (heavy, and absent on the GPU host): the three files

    triton_decode_attention.py  triton_turboquant_decode.py  triton_turboquant_store.py

are copied out of the wheel into an ignored folder (``.baselines/``, never
committed) and executed here under their real module names, with minimal
stand-ins for the two vLLM modules they import (``vllm.triton_utils`` and
``vllm.platforms``). ``sys.modules`` is restored afterwards, so a real vLLM
in the same process is left alone.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

from ... import env as sndr_env
from .._baseline import load_with_stubs

FILES = ("triton_decode_attention.py", "triton_turboquant_decode.py", "triton_turboquant_store.py")
_PKG = "vllm.v1.attention.ops"


def candidate_dirs(repo_root: Path | None = None, version: str = "0.32.0") -> list[Path]:
    """Where vLLM ``version``'s copied files may be: $SNDR_TQ_BASELINE, <repo>/.baselines/vllm032_tq (0.32.0)
    or <repo>/.baselines/vllm-<version>_tq, the sndr tree cache's vllm-<version>."""
    out = []
    if os.environ.get(sndr_env.TQ_BASELINE):
        out.append(Path(os.environ[sndr_env.TQ_BASELINE]))
    root = repo_root or Path(__file__).resolve().parents[3]
    if version == "0.32.0":
        out.append(root / ".baselines" / "vllm032_tq")
    out.append(root / ".baselines" / f"vllm-{version}_tq")
    from ... import caches  # the cache-root rule: code is never loaded from a cache another uid could change

    trees = caches.dir_path(sndr_env.CACHE_TREES, "tree cache", without=f"the cached {version} tree is not a baseline candidate")
    if trees is not None:
        out.append(trees / f"vllm-{version}" / "vllm" / "v1" / "attention" / "ops")
    return out


def find_dir(repo_root: Path | None = None, version: str = "0.32.0", fetch: bool = False) -> Path | None:
    """The first candidate holding all three files; ``fetch``: else fetch vLLM ``version``'s tree
    (``sndr.tree.fetch_version``: its wheel's .py files, into the tree cache) and take its copy."""
    for d in candidate_dirs(repo_root, version):
        if all((d / f).is_file() for f in FILES):
            return d
    if fetch:
        from ...tree import fetch_version

        d = Path(fetch_version(version)) / "vllm" / "v1" / "attention" / "ops"
        if all((d / f).is_file() for f in FILES):
            return d
    return None


class _Platform:
    @staticmethod
    def is_cuda_alike() -> bool:
        import torch

        return torch.cuda.is_available()

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def is_cuda() -> bool:
        import torch

        return torch.cuda.is_available()


def load(src: Path) -> types.SimpleNamespace:
    """Execute the copied files; return their store, decode and stage-2 objects."""
    import triton
    import triton.language as tl

    stubs: dict[str, types.ModuleType] = {}
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", _PKG):
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules resolve through sys.modules
        stubs[name] = m
    tu = types.ModuleType("vllm.triton_utils")
    tu.__dict__.update(tl=tl, triton=triton)
    stubs["vllm.triton_utils"] = tu
    pl = types.ModuleType("vllm.platforms")
    pl.__dict__.update(current_platform=_Platform())
    stubs["vllm.platforms"] = pl

    loaded = load_with_stubs(_PKG, src, FILES, stubs)
    return types.SimpleNamespace(
        store=loaded["triton_turboquant_store"].triton_turboquant_store,
        decode=loaded["triton_turboquant_decode"].triton_turboquant_decode_attention,
        modules=loaded,
    )
