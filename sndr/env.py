"""Every environment variable sndr reads, in one place (the vLLM convention)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import bad_input

#: ``SNDR_ENABLE_<ID>=0|1`` overrides a patch's ``default``.
ENABLE_PREFIX = "SNDR_ENABLE_"
#: ``SNDR_STRICT=1``: a required patch that is not active aborts vLLM startup.
STRICT = "SNDR_STRICT"
#: Directory for per-process attestation records.
RUN_DIR = "SNDR_RUN_DIR"
#: Root of sndr's caches (fetched trees, compiled code). Defaults to $XDG_CACHE_HOME/sndr.
CACHE_DIR = "SNDR_CACHE_DIR"
#: Patch directory override for the hook and the CLI default.
PATCHES = "SNDR_PATCHES"
#: Tree override for the hook (the directory that contains ``vllm/``).
TREE = "SNDR_TREE"
#: Test-only: kill the process at a named commit step (see tests/reliability).
FAULT = "SNDR_TEST_FAULT"
#: ``SNDR_OFFLINE=1``: ``vllm==X`` trees must come from the cache; never run pip.
OFFLINE = "SNDR_OFFLINE"
#: Test-only: interpreter of a real vLLM install (default /opt/vllm-venv/bin/python).
TEST_VLLM_PYTHON = "SNDR_TEST_VLLM_PYTHON"
#: ``SNDR_HOOK=0``: the in-memory import hook stays inert in this process (its .pth still loads).
HOOK = "SNDR_HOOK"
#: TurboQuant k8v4 decode backend: ``auto`` (CUDA where it supports the call, else Triton),
#: ``cuda`` (raise instead of falling back) or ``triton``.
TQ_BACKEND = "SNDR_TQ_BACKEND"
#: Path of the ``libnvrtc`` that compiles sndr's CUDA kernels (tried before the usual places).
NVRTC = "SNDR_NVRTC"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_flag(name: str, default: bool = False, environ=None) -> bool:
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None:
        return default
    val = raw.strip().lower()
    if val in _TRUE:
        return True
    if val in _FALSE:
        return False
    raise bad_input("bad_env", f"{name}={raw!r} is not a boolean; use 0 or 1", key=name)


def enable_override(patch_id: str, environ=None) -> bool | None:
    """Value of ``SNDR_ENABLE_<ID>`` (id upper-cased, ``-`` -> ``_``), or None."""
    environ = os.environ if environ is None else environ
    name = ENABLE_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", patch_id).upper()
    if name not in environ:
        return None
    raw = environ[name].strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise bad_input("bad_env", f"{name}={environ[name]!r} is not 0 or 1", key=name, patch=patch_id,
                    hint=f"set {name}=1 to enable {patch_id} or {name}=0 to disable it")


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sndr"
