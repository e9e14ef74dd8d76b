"""Issue 21 s.1 end to end: `pip install --force-reinstall vllm==0.32.0` under a patched tree, then apply.

A fresh venv over a private copy of the real vLLM 0.32.0 install (``vllm_env.py``);
pip really uninstalls and reinstalls vLLM in it, as an operator's container does.
The shipped patch set, the real CLI.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from sndr import env as envmod

pytestmark = pytest.mark.vllm_install


def _wheel_or_spec() -> str:
    """The cached 0.32.0 wheel when sndr's cache holds one (no network), else the index's."""
    wheels = envmod.cache_root() / envmod.CACHE_WHEELS
    found = sorted(wheels.glob("vllm-0.32.0-*.whl")) if wheels.is_dir() else []
    return str(found[0]) if found else "vllm==0.32.0"


def _sndr(env, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([env.python, "-m", "sndr.apply", *args], capture_output=True, text=True,
                          env=env.environ(**kw), timeout=600)


def test_apply_after_a_real_pip_reinstall_patches_the_tree_again(make_vllm_env, tmp_path):
    env = make_vllm_env(patches=envmod.shipped_patches_dir())
    first = _sndr(env, "--tree", str(env.site), "--json", "-", "-q")
    assert first.returncode == 0, first.stderr
    applied = json.loads(first.stdout)
    written = sorted(applied["files_written"])
    assert written, "the shipped set wrote nothing on a pristine 0.32.0"
    patched = {rel: (env.site / rel).read_bytes() for rel in written}

    pip = subprocess.run([env.python, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-compile",
                          "--disable-pip-version-check", "-q", _wheel_or_spec()],
                         capture_output=True, text=True, env=env.environ(), timeout=900)
    if pip.returncode != 0 and "No matching distribution" in pip.stderr + pip.stdout:
        pytest.skip(f"no_vllm_wheel: no cached vllm 0.32.0 wheel and the index has none: {pip.stderr[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    # pip put the pristine files back; .sndr/ (pip knows nothing of it) still says "patched".
    assert (env.site / ".sndr" / "ledger.json").is_file()
    assert all((env.site / rel).read_bytes() != patched[rel] for rel in written)
    verify = _sndr(env, "--tree", str(env.site), "--verify", "--json", "-", "-q")
    assert verify.returncode == 1
    assert {p["code"] for p in json.loads(verify.stdout)["problems"]} == {"hash_mismatch"}

    again = _sndr(env, "--tree", str(env.site), "--json", "-", "-q")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert sorted(report["files_written"]) == written
    assert any("back to pristine" in n for n in report["notes"])
    assert not any("already applied" in n for n in report["notes"])
    assert {rel: (env.site / rel).read_bytes() for rel in written} == patched
    assert _sndr(env, "--tree", str(env.site), "--verify", "-q").returncode == 0
    # The default tree (where `import vllm` finds it) is the same one: no --tree needed.
    assert _sndr(env, "--verify", "-q").returncode == 0
