"""Shared fixtures: real vLLM source trees fetched from PyPI wheels.

Trees are fetched once into sndr's cache ($XDG_CACHE_HOME/sndr/trees) by
``sndr.tree.fetch_version`` (the same code the CLI uses for ``vllm==X``).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

PIN = "0.32.0"
CANDIDATE = "0.33.0"

# The suite starts a few hundred Python children (``python -m sndr ...``, the hook's synthetic trees), each
# importing sndr. Under PYTHONDONTWRITEBYTECODE every child compiled the package from source again and
# pytest rewrote every test module on every run (9 s of the inner loop's CPU). The tests write bytecode
# (into the git-ignored __pycache__/) whatever the caller's setting; hook_fixtures.Box did so already
# for its children. Set here, before any test module is imported and before xdist starts its workers.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="run the long variants")


#: Fixtures that need a fetched vLLM tree (PyPI wheels, cached under ~/.cache/sndr/trees), the CPU vLLM
#: install or anything built from them. A test that uses one (directly or through another fixture) is
#: marked ``needs_wheels``, so ``pytest -m "not slow and not needs_wheels"`` is hermetic.
WHEEL_FIXTURES = frozenset({
    "vllm_pin_root", "vllm_candidate_root", "vllm_root", "pin_tree", "pin_subtree",  # this file
    "sndr_pin_tree", "sndr_patch_on_pin",  # sndr.testing
    "vllm_py",  # this file (the CPU vLLM install's interpreter)
    "patched_pin_root",  # tests/patches
    "vllm_install", "vllm_master", "make_vllm_env",  # tests/e2e
    "scenario",  # tests/reliability (a copy of the pin tree)
})
#: Folders whose tests all need wheels: real vLLM installs (e2e), torch/triton and GPUs (kernels).
WHEEL_DIRS = ("e2e", "kernels")
#: Fixtures of one test module that fetch a tree: (module file, fixture name).
WHEEL_MODULE_FIXTURES = frozenset({("test_configdrift.py", "trees"), ("test_manifest.py", "pin"),
                                   ("test_packaging.py", "wheel")})  # pip wheel: hatchling from PyPI
#: Tests that fetch a tree inline (``open_tree("vllm==X")``, ``request.getfixturevalue``), by node id prefix.
WHEEL_TESTS = (
    "tests/test_generated_current.py::",
    "tests/preflight/test_preflight.py::test_every_verdict",
    "tests/preflight/test_preflight.py::test_top_suggestion_overlaps_the_true_location",
    "tests/test_manifest.py::test_check_missing_manifest_for_tree",
)


pytest_plugins = ["sndr.testing"]  # assert_patch's fixtures (sndr_pin_tree, sndr_patch_on_pin)


def _fast_tier(config) -> bool:
    return "not needs_wheels" in (config.getoption("markexpr", "") or "")


@pytest.fixture(scope="session")
def inner_loop(request) -> bool:
    """True in the inner-loop tier (``-m "not slow and not needs_wheels"``). A test that repeats a race
    (rounds of an attack, of a crash) runs fewer rounds there; the full suite runs them all."""
    return _fast_tier(request.config)


def pytest_ignore_collect(collection_path, config):
    """In the fast tier, the wheel-only folders are not even imported (torch, triton, vLLM)."""
    here = Path(__file__).resolve().parent
    if _fast_tier(config) and collection_path.parent == here and collection_path.name in WHEEL_DIRS:
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collection imports every test module (sndr, pydantic, ruamel, hypothesis): 460,000 long-lived objects
    per process, which the cyclic garbage collector then traversed again and again, 2 s of collection and
    about 4 s of each xdist worker's run in the inner loop. No cycle collection while importing; then the
    objects alive after collection are frozen (``gc.freeze``: the collector no longer scans them; they live
    to the end of the session anyway). What the tests allocate is still collected, in collections 14 times
    rarer (the first threshold 10,000 allocations instead of 700): the code scans parse all of sndr (about
    a million AST objects, no cycles among them) and every full collection walked them again."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 10, 10)


def pytest_collection_modifyitems(config, items):
    tests_dir = Path(__file__).resolve().parent
    needs_wheels = pytest.mark.needs_wheels
    for item in items:
        path = Path(str(item.fspath))
        rel = path.relative_to(tests_dir).parts if path.is_relative_to(tests_dir) else ()
        names = set(getattr(item, "fixturenames", ()))
        if (WHEEL_FIXTURES & names or {(path.name, n) for n in names} & WHEEL_MODULE_FIXTURES
                or (rel and rel[0] in WHEEL_DIRS) or item.nodeid.startswith(WHEEL_TESTS)
                or "vllm_install" in item.keywords or "gpu" in item.keywords):
            item.add_marker(needs_wheels)
    if _fast_tier(config):  # the inner loop leaves out the full_only variants (their reason names what stays)
        left_out = [item for item in items if item.get_closest_marker("full_only")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("full_only")]
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


@pytest.fixture(scope="session")
def vllm_py() -> str:
    """The interpreter of the CPU vLLM 0.32.0 install (``tests/e2e/vllm_env.py``, the one resolver of it), or a
    skip naming how to build it."""
    e2e = str(Path(__file__).resolve().parent / "e2e")
    if e2e not in sys.path:
        sys.path.insert(0, e2e)  # as tests/e2e/conftest.py does: one module object either way
    import vllm_env

    python = vllm_env.vllm_python()
    if python is None:
        pytest.skip(vllm_env.skip_reason())
    return python


# The vLLM 0.32.0 files the core patch set (tests/data/core) touches: one list for every test of that set.
CORE_SET_FILES = [
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/block_pool.py",
    "vllm/plugins/__init__.py",
]


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
