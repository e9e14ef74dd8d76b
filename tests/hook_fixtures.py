"""Small synthetic vLLM-shaped trees for the hook, importer and runtime tests.

The real-install tests live in ``tests/e2e``; these run in a second or two.
Every child interpreter gets an isolated cache, run directory and patch set
through the environment, never the developer's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ENGINE = '''\
"""A stand-in for a vLLM module."""


class Engine:
    def step(self, n):
        return n + 1

    @classmethod
    def build(cls, size):
        return cls()

    @staticmethod
    def helper(x):
        return x * 2


class Child(Engine):
    pass


def answer():
    return 41


def boom():
    raise ValueError("pristine boom")
'''

PATCHES = {
    "F0001-answer.toml": '''
        id = "F0001"
        title = "The answer"

        [[files]]
        path = "vllm/engine.py"

        [[files.edits]]
        name = "answer"
        anchor = \'\'\'
            return 41
        \'\'\'
        replacement = \'\'\'
            return 42
        \'\'\'

        [[files.edits]]
        name = "boom"
        anchor = \'\'\'
        def boom():
            raise ValueError("pristine boom")
        \'\'\'
        replacement = \'\'\'
        # Three lines pushed in front of boom, so a traceback that used the
        # pristine file's lines would show the wrong text.

        def boom():
            raise ValueError("patched boom")
        \'\'\'
    ''',
    "F0002-sub.toml": '''
        id = "F0002"
        title = "A package __init__"

        [[files]]
        path = "vllm/sub/__init__.py"

        [[files.edits]]
        name = "value"
        anchor = \'\'\'
        VALUE = "pristine"
        \'\'\'
        replacement = \'\'\'
        VALUE = "patched"
        \'\'\'
    ''',
    "F0003-count.toml": '''
        id = "F0003"
        title = "Count Engine.step"
        kind = "runtime"

        [[runtime]]
        name = "count"
        target = "vllm.engine:Engine.step"
        replacement = "sndr.startup.runtime:call_counter"
        wrap = true
        signature = "(self, n)"
    ''',
}


def _dedent_toml(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def make_tree(root: Path) -> Path:
    """A tree root holding a minimal ``vllm`` package of version 0.32.0."""
    (root / "vllm" / "sub").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text('"""fake vllm"""\n')
    (root / "vllm" / "_version.py").write_text('__version__ = "0.32.0"\n')
    (root / "vllm" / "engine.py").write_text(ENGINE)
    (root / "vllm" / "sub" / "__init__.py").write_text('VALUE = "pristine"\n')
    return root


def make_patches(directory: Path, only: list[str] | None = None, replace: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in PATCHES.items():
        if only is not None and name.split("-")[0] not in only:
            continue
        text = _dedent_toml(text)
        for old, new in (replace or {}).items():
            text = text.replace(old, new)
        (directory / name).write_text(text)
    return directory


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "vllm").rglob("*.py"))}


class Box:
    """A root, a patch set, a cache and a run dir, all under one tmp directory."""

    def __init__(self, tmp: Path, only: list[str] | None = None):
        self.tmp = tmp
        self.root = make_tree(tmp / "site")
        self.patches = make_patches(tmp / "patches", only)
        self.cache = tmp / "cache"
        self.run_dir = tmp / "run"

    def environ(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SNDR_", "PYTHONPATH"))}
        env.update(PYTHONPATH=f"{self.root}{os.pathsep}{REPO}", SNDR_CACHE_DIR=str(self.cache),
                   SNDR_RUN_DIR=str(self.run_dir), SNDR_PATCHES=str(self.patches))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env

    def py(self, code: str, check: bool = True, python: str | None = None, **extra) -> subprocess.CompletedProcess:
        proc = subprocess.run([python or sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              cwd=str(self.tmp), env=self.environ(**extra), timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"child failed (rc {proc.returncode})\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
        return proc

    def apply(self, **env):
        from sndr.apply import run_apply
        from sndr.load import load_patch_set

        report = run_apply(self.root, load_patch_set(self.patches, packs=False), environ=dict(os.environ, **env))
        assert report.ok, report.model_dump_json(indent=1)
        return report

    def records(self) -> list[dict]:
        if not self.run_dir.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.run_dir.glob("*.json"))]

    def ledger(self) -> dict:
        return json.loads((self.root / ".sndr" / "ledger.json").read_text())


def out_of(proc) -> dict:
    """The JSON a child script printed on its last ``OUT`` line."""
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1]
    return json.loads(line[3:])


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


@pytest.fixture
def applied(tmp_path, monkeypatch):
    """A Box whose set is applied in-process, with this process's SNDR_* environment pointing at the box's cache
    and patch set (no developer setting leaks in)."""
    box = Box(tmp_path)
    for k in [k for k in os.environ if k.startswith("SNDR_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(box.cache))
    monkeypatch.setenv("SNDR_PATCHES", str(box.patches))
    box.apply()
    return box


def replace_file(path: Path, text: str) -> None:
    """Write through a new inode (as sndr and pip do), never in place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def make_venv(tmp: Path, site_root: Path | None = None) -> tuple[str, Path]:
    """A venv over this interpreter whose site-packages sees this checkout (like ``pip install -e``)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True,
                   capture_output=True)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "00-sndr-dev.pth").write_text(str(REPO) + "\n")
    return str(venv / "bin" / "python"), site
