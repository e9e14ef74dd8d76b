"""Shared fixtures: real vLLM source trees fetched from PyPI wheels.

Trees are fetched once into sndr's cache ($XDG_CACHE_HOME/sndr/trees) by
``sndr.tree.fetch_version`` (the same code the CLI uses for ``vllm==X``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

PIN = "0.32.0"
CANDIDATE = "0.33.0"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="run the long variants")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="long variant; run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _fetch(version: str) -> Path:
    from sndr.tree import fetch_version

    return fetch_version(version)


@pytest.fixture(scope="session")
def vllm_pin_root() -> Path:
    """Read-only cached root (contains ``vllm/``) of the pinned vLLM 0.32.0."""
    return _fetch(PIN)


@pytest.fixture(scope="session")
def vllm_candidate_root() -> Path:
    """Read-only cached root of the bump candidate, vLLM 0.33.0."""
    return _fetch(CANDIDATE)


@pytest.fixture(scope="session")
def vllm_root():
    """Factory: ``vllm_root("0.10.1")`` -> cached read-only root of that version."""
    return _fetch


def copy_tree(src: Path, dst: Path, paths: list[str] | None = None) -> Path:
    """Copy a real tree (or only ``paths`` of it, plus its version files) to ``dst``."""
    if paths is None:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".complete"))
        return dst
    keep = set(paths) | {"vllm/__init__.py", "vllm/version.py", "vllm/_version.py"}
    for rel in sorted(keep):
        s = src / rel
        if s.exists():
            d = dst / rel
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
    for info in src.glob("*.dist-info"):
        shutil.copytree(info, dst / info.name)
    return dst


@pytest.fixture
def pin_tree(tmp_path, vllm_pin_root) -> Path:
    """A private, writable full copy of the vLLM 0.32.0 tree."""
    return copy_tree(vllm_pin_root, tmp_path / "site")


@pytest.fixture
def pin_subtree(tmp_path, vllm_pin_root):
    """Factory: a writable copy of only the given real files of vLLM 0.32.0."""

    def make(paths: list[str]) -> Path:
        return copy_tree(vllm_pin_root, tmp_path / "site", paths)

    return make
