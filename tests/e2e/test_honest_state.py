"""Issue 32 HIGH 1, HIGH 2 and MEDIUM 4 on the real vLLM install: what status and dry-run say matches
the tree and the processes.

* A live vLLM process (``load_general_plugins()``, as every vLLM process runs it) attests the shipped
  set; ``apply --only PG0006`` re-applies another set under it: ``status --live`` exits 1 and the
  textfile says ``sndr_status_ok 0.0`` (was: "ok ... active 32/32", exit 0, 1.0).
* ``pip install --no-deps vllm==0.33.0`` under a patched 0.32.0 tree, for real: ``--dry-run`` gives
  the apply's verdicts and exit status, which are those of a never-touched 0.33.0 (merged edits read
  merged); and back to 0.32.0 the same, with no "merged" on a pristine tree.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from sndr import env as envmod

pytestmark = pytest.mark.vllm_install


def _sndr(env, *args, module: str = "sndr.apply", **kw) -> subprocess.CompletedProcess:
    return subprocess.run([env.python, "-m", module, *args], capture_output=True, text=True,
                          env=env.environ(**kw), timeout=900)


def _report(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout)


LIVE = ("from vllm.plugins import load_general_plugins as l; l(); import sys; print('READY', flush=True); "
        "sys.stdin.read()")


def test_status_live_fails_after_a_reapply_under_a_live_vllm_process(make_vllm_env, tmp_path):
    env = make_vllm_env(patches=envmod.shipped_patches_dir())
    first = _sndr(env, "--tree", str(env.site), "-q")
    assert first.returncode == 0, first.stdout + first.stderr
    proc = subprocess.Popen([env.python, "-c", LIVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env.environ(), cwd=str(tmp_path))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read() if proc.stderr else line
        prom = tmp_path / "s.prom"
        ok = subprocess.run([env.python, "-m", "sndr", "status", "--live", "--prometheus", str(prom)],
                            capture_output=True, text=True, env=env.environ(), timeout=300)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "sndr_status_ok 1.0" in prom.read_text()
        again = _sndr(env, "--tree", str(env.site), "--only", "PG0006", "-q")  # another set: files to pristine
        assert again.returncode == 0, again.stdout + again.stderr
        st = subprocess.run([env.python, "-m", "sndr", "status", "--live", "--prometheus", str(prom)],
                            capture_output=True, text=True, env=env.environ(), timeout=300)
        assert st.returncode == 1, st.stdout + st.stderr
        assert f"pid {proc.pid} " in st.stdout and "the tree was re-applied since it attested" in st.stdout
        assert "do not hold the bytes it attested" in st.stdout and "restart it" in st.stdout
        assert "sndr_status_ok 0.0" in prom.read_text()
        verify = _sndr(env, "--tree", str(env.site), "--verify", "-q")
        assert verify.returncode == 1 and "patch_set_mismatch" in verify.stdout + verify.stderr
    finally:
        proc.communicate("", timeout=120)


def _wheel(version: str) -> str:
    """The cached wheel when sndr's cache holds one (no network), else the index's."""
    wheels = envmod.cache_root() / envmod.CACHE_WHEELS
    found = sorted(wheels.glob(f"vllm-{version}-*.whl")) if wheels.is_dir() else []
    return str(found[0]) if found else f"vllm=={version}"


def _pip_install(env, version: str) -> None:
    pip = subprocess.run([env.python, "-m", "pip", "install", "--no-deps", "--no-compile",
                          "--disable-pip-version-check", "-q", _wheel(version)],
                         capture_output=True, text=True, env=env.environ(), timeout=900)
    if pip.returncode != 0 and "No matching distribution" in pip.stderr + pip.stdout:
        pytest.skip(f"no_vllm_wheel: no cached vllm {version} wheel and the index has none: {pip.stderr[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]


def _verdicts(report: dict) -> dict:
    return {"ok": report["ok"], "exit": report["exit_code"], "counts": report["counts"],
            "edits": [(p["id"], e["file"], e["name"], e["verdict"]) for p in report["patches"] for e in p["edits"]],
            "problems": sorted((p["code"], p.get("patch") or "", p.get("file") or "") for p in report["problems"]),
            "files": sorted(report["files_written"])}


def _dry_and_real(env, *extra) -> tuple[dict, dict, subprocess.CompletedProcess]:
    dry = _sndr(env, "--tree", str(env.site), "--dry-run", "--json", "-", "-q", *extra)
    real = _sndr(env, "--tree", str(env.site), "--json", "-", "-q", *extra)
    return _verdicts(_report(dry)), _verdicts(_report(real)), real


def _clean(env, version: str) -> dict:
    """The set on a never-touched tree of ``version``: sndr's cached copy (the user's cache, where the
    wheel fixtures put it; the env's own cache is empty)."""
    proc = _sndr(env, "--tree", f"vllm=={version}", "--dry-run", "--json", "-", "-q",
                 SNDR_CACHE_DIR=str(envmod.cache_root()))
    return _verdicts(_report(proc))


def test_dry_run_after_a_real_pip_upgrade_and_back_is_the_apply(make_vllm_env):
    env = make_vllm_env(patches=envmod.shipped_patches_dir())
    assert _sndr(env, "--tree", str(env.site), "-q").returncode == 0
    t0 = time.monotonic()
    _pip_install(env, "0.33.0")
    dry, real, proc = _dry_and_real(env)
    assert dry == real, (dry, real)
    assert any(n.startswith("ledger_stale") for n in _report(proc)["notes"])
    clean = _clean(env, "0.33.0")
    assert (real["ok"], real["exit"], real["counts"], real["edits"]) == \
        (clean["ok"], clean["exit"], clean["counts"], clean["edits"])
    assert real["counts"].get("merged", 0) > real["counts"].get("applies", 0)  # 0.33.0 merged most of the set
    # Back to 0.32.0 from a 0.33.0 ledger (--keep-going leaves out what 0.33.0 breaks).
    _sndr(env, "--tree", str(env.site), "--keep-going", "-q")
    _pip_install(env, "0.32.0")
    dry, real, proc = _dry_and_real(env)
    assert dry == real, (dry, real)
    assert real["ok"] and real["exit"] == 0 and "merged" not in real["counts"], real["counts"]
    clean = _clean(env, "0.32.0")
    assert real["counts"] == clean["counts"] and real["edits"] == clean["edits"]
    assert _sndr(env, "--tree", str(env.site), "--verify", "-q").returncode == 0
    assert time.monotonic() - t0 < 1800
