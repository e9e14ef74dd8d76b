"""``VLLM_PLUGINS`` without sndr, on the real vLLM 0.32.0 install: never silent.

vLLM 0.32.0 (``vllm/plugins/__init__.py``) calls a ``vllm.general_plugins`` entry point only when
``VLLM_PLUGINS`` is unset or names it exactly. sndr's is ``sndr = sndr.startup.hook:register``; left out, the
process used to run with none of sndr's runtime patches (here H0003, a wrapper of
``Scheduler._update_after_schedule``) and no attestation, and ``sndr status`` said nothing about it.

* With the in-memory hook installed, the process that loads its plugins without sndr's attests anyway: its
  record names ``VLLM_PLUGINS`` and its value (``vllm_plugins_excludes_sndr``) and H0003 as NOT active, it says
  so on stderr, ``status --live`` (run in an environment without ``VLLM_PLUGINS``) fails on the record, and
  ``SNDR_STRICT=1`` stops its startup. A list naming ``sndr`` changes nothing.
* sndr's entry point not installed at all (sndr only on ``sys.path``): ``plugin_not_called``.
* Patched on disk, without the hook, nothing of sndr runs in that process: ``sndr status`` and ``apply`` check
  the environment they run in (a readiness probe's is the container's).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from sndr.__main__ import main as sndr_main

pytestmark = pytest.mark.vllm_install

#: As every vLLM process does it: load the general plugins; then the runtime patch's mark on its target.
LIVE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.core.sched.scheduler import Scheduler
import sys
print("MARK", getattr(Scheduler._update_after_schedule, "__sndr_patch__", None), flush=True)
if "--wait" in sys.argv:
    sys.stdin.read()
"""


def _status(env, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([env.python, "-m", "sndr", "status", "--run-dir", env.extra_env["SNDR_RUN_DIR"], *args],
                          capture_output=True, text=True, env=env.environ(**kw), timeout=300)


def test_in_memory_a_process_vllm_plugins_leaves_sndr_out_of_attests_it_and_status_live_fails(make_vllm_env, tmp_path):
    env = make_vllm_env()
    assert sndr_main(["hook", "install", "--site", str(env.site)]) == 0
    script = tmp_path / "live.py"
    script.write_text(LIVE)
    proc = subprocess.Popen([env.python, str(script), "--wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env.environ(VLLM_PLUGINS="lora_resolver"),
                            cwd=str(tmp_path))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "MARK None", line  # the runtime patch is not installed: vLLM never called sndr
        # status --live in an environment without VLLM_PLUGINS: the finding comes from the process's own record
        st = _status(env, "--live", "--json", "-", VLLM_PLUGINS=None)
        assert st.returncode == 1, st.stdout + st.stderr
        report = json.loads(st.stdout)  # stdout holds the JSON document only
        (rec,) = [r for r in report["processes"] if r["pid"] == proc.pid]
        assert rec["mode"] == "memory" and rec["text"]["served"]  # the text patches are served all the same
        assert rec["missing_required"] == ["H0003: runtime patch not active: vLLM did not call sndr's plugin"]
        found = "\n".join(report["findings"])
        assert f"pid {proc.pid}" in found and "VLLM_PLUGINS='lora_resolver' does not name 'sndr'" in found
        assert "(vllm_plugins_excludes_sndr)" in found and "set VLLM_PLUGINS=lora_resolver,sndr" in found
        assert "missing H0003: runtime patch not active" in found
        assert "in the environment sndr status runs in" not in found
        text = _status(env, "--live", VLLM_PLUGINS=None)
        assert text.returncode == 1 and "NOT active: H0003" in text.stdout, text.stdout
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=60)
    # the process said it, once, on stderr: the patch and VLLM_PLUGINS with its value
    assert "required patch(es) NOT active" in err and "H0003" in err, err
    assert err.count("VLLM_PLUGINS='lora_resolver' does not name 'sndr'") == 1, err

    # the same list with sndr in it: the runtime patch is active and status is ok
    ok = make_vllm_env("ok")
    assert sndr_main(["hook", "install", "--site", str(ok.site)]) == 0
    run = ok.run(LIVE, VLLM_PLUGINS="lora_resolver,sndr")
    assert "MARK H0003/count" in run.stdout and "VLLM_PLUGINS" not in run.stderr, run.stderr
    st = _status(ok, VLLM_PLUGINS="lora_resolver,sndr")
    assert st.returncode == 0, st.stdout + st.stderr


def test_strict_stops_the_startup_of_a_process_vllm_plugins_leaves_sndr_out_of(make_vllm_env):
    env = make_vllm_env()
    assert sndr_main(["hook", "install", "--site", str(env.site)]) == 0
    proc = env.run(LIVE, check=False, VLLM_PLUGINS="", SNDR_STRICT="1")
    assert proc.returncode != 0 and "MARK" not in proc.stdout
    assert "StrictError" in proc.stderr and "refusing to start vLLM" in proc.stderr, proc.stderr
    assert "VLLM_PLUGINS='' does not name 'sndr': it names no plugin" in proc.stderr
    assert "H0003: runtime patch not active" in proc.stderr


def test_sndr_on_sys_path_without_its_entry_point_is_plugin_not_called(make_vllm_env):
    env = make_vllm_env()
    assert sndr_main(["hook", "install", "--site", str(env.site)]) == 0
    (env.site / "sndr-0.1.0.dist-info" / "entry_points.txt").unlink()  # importable, but no vllm.general_plugins
    run = env.run(LIVE)
    assert "MARK None" in run.stdout and "(plugin_not_called)" in run.stderr, run.stderr
    st = _status(env)
    assert st.returncode == 1 and "(plugin_not_called)" in st.stdout and "NOT active: H0003" in st.stdout, st.stdout


def test_on_disk_status_and_apply_check_the_environment_they_run_in(make_vllm_env):
    env = make_vllm_env()
    applied = subprocess.run([env.python, "-m", "sndr.apply", "--tree", str(env.site), "-q"], capture_output=True,
                             text=True, env=env.environ(), timeout=600)
    assert applied.returncode == 0 and "VLLM_PLUGINS" not in applied.stderr, applied.stderr
    bad = "lora_resolver, sndr"  # a space: vLLM compares ' sndr', not 'sndr'
    run = env.run(LIVE, VLLM_PLUGINS=bad)
    assert "MARK None" in run.stdout  # no hook: nothing of sndr ran in that process, and it wrote no record
    st = _status(env, VLLM_PLUGINS=bad)
    assert st.returncode == 1, st.stdout
    assert "in the environment sndr status runs in: VLLM_PLUGINS='lora_resolver, sndr'" in st.stdout
    assert "' sndr' is not 'sndr'" in st.stdout and "(vllm_plugins_excludes_sndr)" in st.stdout
    assert "no attestation records" in st.stdout and "check its environment" in st.stdout
    verify = subprocess.run([env.python, "-m", "sndr.apply", "--verify", "--tree", str(env.site), "--json", "-"],
                            capture_output=True, text=True, env=env.environ(VLLM_PLUGINS=bad), timeout=600)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # the tree is fine; the warning is loud
    assert "sndr: warning: VLLM_PLUGINS='lora_resolver, sndr'" in verify.stderr
    assert any("(vllm_plugins_excludes_sndr)" in n for n in json.loads(verify.stdout)["notes"])
    # with sndr named, the same processes attest and status is ok
    run = env.run(LIVE, VLLM_PLUGINS="lora_resolver,sndr")
    assert "MARK H0003/count" in run.stdout
    assert _status(env, VLLM_PLUGINS="lora_resolver,sndr").returncode == 0
