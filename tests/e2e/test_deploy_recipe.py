"""docs/deploy.md's two Dockerfiles, run step by step against a real vLLM 0.32.0 install.

Docker is not available here, so each ``RUN`` line is executed, as written, in a
venv over a private copy of the real install (``vllm_env.py``); ``ENV`` lines
become the serving process's environment (directories remapped under a temp
dir). The steps are parsed from the page itself, so the docs cannot drift from
what is tested. The read-only image bind-mounts site-packages read-only (root).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_install

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
SNDR_INSTALL = "pip install --no-cache-dir sndr"

SERVE = r'''
import json
import vllm.plugins
vllm.plugins.load_general_plugins()
import sndr.startup.hook as h
from vllm.v1.core.sched import scheduler  # a patched module, served (memory) or read (disk)
print("OUT" + json.dumps({"mode": h._STATE.mode, "missing": h._STATE.missing, "problems": h._STATE.problems,
                          "digest": h._STATE.digest, "loader": type(scheduler.__spec__.loader).__name__}))
'''


def dockerfiles() -> list[list[str]]:
    """The ``dockerfile`` blocks of docs/deploy.md, each as its logical lines (continuations joined)."""
    blocks = re.findall(r"```dockerfile\n(.*?)```", DOC.read_text(), flags=re.S)
    out = []
    for block in blocks:
        lines, cur = [], ""
        for raw in block.splitlines():
            cur += raw.rstrip()
            if cur.endswith("\\"):
                cur = cur[:-1] + " "
                continue
            if cur.strip():
                lines.append(" ".join(cur.split()))
            cur = ""
        out.append(lines)
    return out


def _env_of(lines: list[str], tmp: Path) -> dict[str, str]:
    env = {}
    for line in lines:
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                k, v = item.split("=", 1)
                # Absolute directories of the image live under the test's temp dir.
                env[k] = str(tmp / v.lstrip("/")) if v.startswith("/") else v
    for k, v in env.items():
        if k in ("SNDR_RUN_DIR", "SNDR_CACHE_DIR", "PROMETHEUS_MULTIPROC_DIR"):
            Path(v).mkdir(parents=True, exist_ok=True)
    return env


def _run_steps(env, lines: list[str]) -> None:
    assert lines[0].startswith("FROM vllm/vllm-openai:v0.32.0")
    runs = [ln[4:] for ln in lines if ln.startswith("RUN ")]
    assert runs[0] == SNDR_INSTALL, "the recipe installs sndr first"  # the venv has sndr from this checkout
    for cmd in runs[1:]:
        argv = shlex.split(cmd)
        assert argv[0] == "python3", cmd
        proc = subprocess.run([env.python, *argv[1:]], capture_output=True, text=True, cwd="/",
                              env=env.environ(SNDR_PATCHES=None), timeout=900)
        assert proc.returncode == 0, f"RUN {cmd} failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def _serve(env, image_env: dict) -> dict:
    proc = env.run(SERVE, SNDR_PATCHES=None, **image_env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1]
    return json.loads(line[3:])


def _status(env, image_env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([env.python, "-m", "sndr", "status"], capture_output=True, text=True, cwd="/",
                          env=env.environ(SNDR_PATCHES=None, **image_env), timeout=300)


def _tree_hash(site: Path) -> str:
    h = hashlib.sha256()
    for p in sorted((site / "vllm").rglob("*.py")):
        h.update(str(p.relative_to(site)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_the_page_has_both_recipes():
    a, b = dockerfiles()
    assert "RUN python3 -m sndr.apply" in a and "RUN python3 -m sndr.apply --verify" in a
    assert "RUN python3 -m sndr hook install" in b
    for lines in (a, b):
        env_line = " ".join(ln for ln in lines if ln.startswith("ENV "))
        assert "SNDR_STRICT=1" in env_line and "SNDR_RUN_DIR=" in env_line and "PROMETHEUS_MULTIPROC_DIR=" in env_line


def test_recipe_a_patched_on_disk_at_build_time(make_vllm_env, tmp_path):
    lines = dockerfiles()[0]
    env = make_vllm_env()
    _run_steps(env, lines)
    assert (env.site / ".sndr" / "ledger.json").is_file()
    image_env = _env_of(lines, tmp_path)
    out = _serve(env, image_env)
    assert out["mode"] == "disk" and out["missing"] == [] and out["loader"] == "SourceFileLoader", out
    ledger = json.loads((env.site / ".sndr" / "ledger.json").read_text())
    assert out["digest"] == ledger["patch_set_digest"]
    status = _status(env, image_env)
    assert status.returncode == 0, status.stdout + status.stderr
    # The verify step is a real gate: a later layer that reinstalls a pristine file fails the build.
    rel = sorted(r for r, e in ledger["files"].items() if e["patches"])[0]  # a file sndr wrote (not one it read)
    pristine = env.site / ".sndr" / "objects" / ledger["files"][rel]["pristine_sha256"]
    assert pristine.is_file()
    target = env.site / rel
    target.unlink()  # a fresh inode, as pip writes it (the venv's files are hard links of the master)
    target.write_bytes(pristine.read_bytes())
    proc = subprocess.run([env.python, "-m", "sndr.apply", "--verify"], capture_output=True, text=True, cwd="/",
                          env=env.environ(SNDR_PATCHES=None), timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to bind-mount site-packages read-only")
def test_recipe_b_read_only_image_with_the_in_memory_hook(make_vllm_env, tmp_path):
    lines = dockerfiles()[1]
    env = make_vllm_env()
    _run_steps(env, lines)
    assert (env.site / "_sndr_hook.pth").is_file()
    before = _tree_hash(env.site)
    site = str(env.site)
    if subprocess.run(["mount", "--bind", site, site], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", site, site], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        with pytest.raises(OSError):
            (env.site / "probe-write").write_text("x")
        image_env = _env_of(lines, tmp_path)
        out = _serve(env, image_env)
        assert out["mode"] == "memory" and out["missing"] == [] and out["loader"] == "PatchedLoader", out
        status = _status(env, image_env)
        assert status.returncode == 0, status.stdout + status.stderr
        warm = _serve(env, image_env)  # second start: from the cache, same answers
        assert warm["digest"] == out["digest"] and warm["missing"] == []
    finally:
        subprocess.run(["umount", site], capture_output=True)
    assert _tree_hash(env.site) == before
    assert not (env.site / ".sndr").exists()
