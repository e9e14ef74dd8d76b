"""Fixtures for the reliability harnesses: a real-file patch set touching 12 files of vLLM 0.32.0."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import copy_tree

# Twelve real files of vLLM 0.32.0, across core, scheduler, worker and attention.
RELIABILITY_FILES = [
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/sched/scheduler.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/sched/output.py",
    "vllm/v1/request.py",
    "vllm/v1/outputs.py",
    "vllm/v1/engine/core.py",
    "vllm/v1/worker/gpu_input_batch.py",
    "vllm/plugins/__init__.py",
]

_TOP = re.compile(r"^(?:def|class) [A-Za-z_][A-Za-z0-9_]*[(:].*$", re.M)


def _unique_top_line(text: str) -> str:
    for m in _TOP.finditer(text):
        line = m.group(0) + "\n"
        if text.count(line) == 1:
            return line
    raise AssertionError("no unique top-level def/class line")


def write_patch_set(root: Path, out: Path, files: list[str] = RELIABILITY_FILES, per_patch: int = 2) -> Path:
    """One comment inserted after a unique top-level def/class line per file, two files per patch."""
    out.mkdir(parents=True, exist_ok=True)
    for n in range(0, len(files), per_patch):
        pid = f"R{n // per_patch + 1:04d}"
        body = [f'id = "{pid}"', f'title = "reliability marker {pid}"', ""]
        for rel in files[n:n + per_patch]:
            line = _unique_top_line((root / rel).read_text())
            body += ["[[files]]", f'path = "{rel}"', "", "[[files.edits]]", 'name = "mark"' if rel == files[n] else 'name = "mark2"',
                     f"anchor = '''\n{line}'''",
                     f"replacement = '''\n{line}# sndr reliability marker {pid} {rel}\n'''", ""]
        (out / f"{pid}-marker.toml").write_text("\n".join(body))
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Every file under vllm/ with its hash: extra temp files count as a difference."""
    base = root / "vllm"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file()}


class Scenario:
    def __init__(self, tmp: Path, pin_root: Path):
        self.pin_root = pin_root
        self.tmp = tmp
        self.patches = write_patch_set(pin_root, tmp / "patches")
        pristine_tree = self.fresh("expected-pristine")
        self.pristine = snapshot(pristine_tree)
        from sndr.apply import run_apply
        from sndr.load import load_patch_set

        patched_tree = self.fresh("expected-patched")
        report = run_apply(patched_tree, load_patch_set(self.patches, packs=False))
        assert report.ok and len(report.files_written) == len(RELIABILITY_FILES)
        self.patched = snapshot(patched_tree)
        self._n = 0

    def fresh(self, name: str | None = None) -> Path:
        self._n = getattr(self, "_n", 0) + 1
        dst = self.tmp / (name or f"tree{self._n}")
        if dst.exists():
            shutil.rmtree(dst)
        return copy_tree(self.pin_root, dst, RELIABILITY_FILES)

    def state(self, root: Path) -> str:
        snap = snapshot(root)
        if snap == self.pristine:
            return "pristine"
        if snap == self.patched:
            return "patched"
        return "TORN"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, vllm_pin_root) -> Scenario:
    return Scenario(tmp_path_factory.mktemp("reliability"), vllm_pin_root)
