"""Fixtures over a real vLLM 0.32.0 CPU install (see vllm_env.py). Skipped, with the reason, when there is none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_env  # noqa: E402

HOOK_PATCHES = vllm_env.HOOK_PATCHES


@pytest.fixture(scope="session")
def vllm_install():
    reason = vllm_env.skip_reason()
    if reason:
        pytest.skip(reason)
    return vllm_env.probe(vllm_env.vllm_python())


@pytest.fixture(scope="session")
def vllm_master(vllm_install, tmp_path_factory):
    return vllm_env.build_master(vllm_install, tmp_path_factory.mktemp("vllm-master"))


@pytest.fixture
def make_vllm_env(vllm_install, vllm_master, tmp_path):
    """Factory: a fresh venv over a private copy of the real vLLM tree, with isolated sndr state."""

    def make(name: str = "env", patches: Path = HOOK_PATCHES) -> vllm_env.Env:
        env = vllm_env.make_env(vllm_install, vllm_master, tmp_path / name)
        env.extra_env.update(SNDR_CACHE_DIR=str(tmp_path / name / "cache"), SNDR_RUN_DIR=str(tmp_path / name / "run"),
                             SNDR_PATCHES=str(patches))
        return env

    return make
