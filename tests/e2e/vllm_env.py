"""Throwaway environments over a real vLLM install, for end-to-end tests and the startup benchmark.

The real install (``$SNDR_TEST_VLLM_PYTHON``, default
``~/.cache/sndr/vllm-0.32.0-venv/bin/python``, the venv ``.ci/run`` builds: ``vllm==0.32.0
torch==2.13.0``, torchvision/torchaudio/torchcodec removed) is never modified. Instead:

* :func:`build_master` copies its ``vllm/`` package once: ``.py`` files and
  their ``__pycache__`` as real files (so imports stay warm), everything else
  (the ~800 MB of ``.so``) as symlinks; plus vLLM's dist-info.
* :func:`make_env` makes a fresh venv per test whose site-packages holds a
  hardlink copy of the master (cheap; sndr and Python both replace files
  atomically, so a write never reaches the master) and ``.pth`` files that

  - put this checkout on ``sys.path`` and register sndr's entry points
    (``vllm.general_plugins``), as ``pip install -e`` would;
  - add the real install's site-packages *after* it, through
    ``site.addsitedir`` so its own ``.pth`` files run too: the copy's
    ``vllm`` shadows the installed one, torch and friends come from the install;
  - add sndr's own dependencies the install lacks (pluggy), last.

The site-packages directory is the tree root sndr patches (it contains
``vllm/``), exactly like a production install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sndr import env as sndr_env

REPO = Path(__file__).resolve().parents[2]
HOOK_PATCHES = REPO / "tests" / "data" / "hook"  # the small real patch set the e2e tests and the benchmark use
#: The venv ``.ci/run`` builds (``$SNDR_TEST_VLLM_VENV`` there); one line builds it by hand, see BUILD_HINT.
#: Both live in sndr/env.py, the one home of the default every ``vllm_install`` test uses.
DEFAULT_PYTHON = sndr_env.DEFAULT_TEST_VLLM_PYTHON
BUILD_HINT = sndr_env.TEST_VLLM_BUILD
ENV_VAR = sndr_env.TEST_VLLM_PYTHON
SNDR_DEPS = ("pydantic", "packaging", "pluggy")

_PROBE = r"""
import importlib.util, json, sys, sysconfig
spec = importlib.util.find_spec("vllm")
out = {"version": "{}.{}".format(*sys.version_info[:2]), "purelib": sysconfig.get_paths()["purelib"]}
if spec is not None:
    out["vllm"] = list(spec.submodule_search_locations)[0]
out["missing"] = [m for m in DEPS if importlib.util.find_spec(m) is None]
print(json.dumps(out))
"""


def vllm_python() -> str | None:
    """The interpreter of the real vLLM install, or None when there is none."""
    python = sndr_env.vllm_test_python()
    if os.path.exists(python):
        return python
    return None


def skip_reason() -> str | None:
    python = vllm_python()
    if python is None:
        where = sndr_env.vllm_test_python()
        return (f"no_vllm_install: no Python at {where} ({ENV_VAR}, default {DEFAULT_PYTHON}, the venv .ci/run "
                f"builds); build it with: {BUILD_HINT}")
    return None


@dataclass
class Install:
    python: str
    site: Path  # site-packages of the real install (contains vllm/)
    vllm_dir: Path
    pyver: str
    missing: list[str]


def probe(python: str) -> Install:
    proc = subprocess.run([python, "-c", _PROBE.replace("DEPS", repr(SNDR_DEPS))], capture_output=True, text=True, cwd="/", timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} failed: {proc.stderr[-2000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if "vllm" not in info:
        raise RuntimeError(f"{python} cannot find vllm")
    vdir = Path(info["vllm"])
    return Install(python=python, site=vdir.parent, vllm_dir=vdir, pyver=info["version"], missing=info["missing"])


def build_master(install: Install, dest: Path) -> Path:
    """A directory holding a copy of ``vllm/`` (.py + .pyc real, the rest symlinked) and its dist-info."""
    dest.mkdir(parents=True, exist_ok=True)
    src_root = install.vllm_dir
    for dirpath, _dirnames, filenames in os.walk(src_root):
        rel = Path(dirpath).relative_to(src_root.parent)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            s = Path(dirpath) / name
            d = dest / rel / name
            if name.endswith((".py", ".pyc")):
                shutil.copy2(s, d)  # keeps mtimes: the copied .pyc files stay valid
            else:
                os.symlink(s, d)
    for info in install.site.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    return dest


@dataclass
class Env:
    python: str
    site: Path  # the tree root: contains vllm/
    base: Install
    extra_env: dict = field(default_factory=dict)

    def environ(self, **overrides) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SNDR_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(self.extra_env)
        env.update({k: str(v) for k, v in overrides.items() if v is not None})
        for k in [k for k, v in overrides.items() if v is None]:
            env.pop(k, None)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        return env

    def run(self, code: str, timeout: float = 900, check: bool = True, **env) -> subprocess.CompletedProcess:
        """Run ``code`` as a script file (so multiprocessing's spawn can re-import ``__main__``)."""
        import tempfile
        import textwrap

        venv = Path(self.python).parent.parent
        fd, script = tempfile.mkstemp(prefix="child_", suffix=".py", dir=str(venv))
        with os.fdopen(fd, "w") as fh:
            fh.write(textwrap.dedent(code))
        proc = subprocess.run([self.python, script], capture_output=True, text=True, cwd=str(venv),
                              env=self.environ(**env), timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"child failed (rc {proc.returncode}):\nSTDOUT:\n{proc.stdout[-4000:]}\n"
                                 f"STDERR:\n{proc.stderr[-6000:]}")
        return proc


def _site_of(venv: Path, pyver: str) -> Path:
    return venv / "lib" / f"python{pyver}" / "site-packages"


def make_env(install: Install, master: Path, dest: Path, runner_python: str | None = None) -> Env:
    """A fresh venv at ``dest`` whose site-packages is a hardlink copy of ``master`` + the overlay .pth files."""
    subprocess.run([install.python, "-m", "venv", "--without-pip", str(dest)], check=True, capture_output=True)
    site = _site_of(dest, install.pyver)
    for entry in master.iterdir():
        target = site / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, copy_function=os.link)
        else:
            os.link(entry, target)
    (site / "00-sndr-dev.pth").write_text(str(REPO) + "\n")
    info = site / "sndr-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sndr\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nsndr = sndr.startup.hook:register\n\n"
                                           "[console_scripts]\nsndr = sndr.__main__:console\n")
    (site / "zz-vllm-base.pth").write_text(f"import site; site.addsitedir({str(install.site)!r})\n")
    if install.missing:
        deps = dest / "sndr-deps"
        deps.mkdir()
        import importlib.util

        for name in install.missing:
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise RuntimeError(f"the test runner lacks {name}, which sndr needs in the vLLM environment")
            src = Path(list(spec.submodule_search_locations)[0]) if spec.submodule_search_locations else Path(spec.origin)
            os.symlink(src, deps / src.name)
        (site / "zzz-sndr-deps.pth").write_text(str(deps) + "\n")
    return Env(python=str(dest / "bin" / "python"), site=site, base=install)
