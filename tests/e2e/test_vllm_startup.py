"""End to end on a real vLLM 0.32.0 CPU install: on-disk mode, in-memory mode, a real runtime patch.

Each test gets a fresh venv over a private copy of the real tree (see
``vllm_env.py``), so applying, tampering and installing the ``.pth`` never
touch the install itself. Run with::

    python -m pytest -m vllm_install tests/e2e

(``$SNDR_TEST_VLLM_PYTHON`` names another install; the default is ``sndr.env.DEFAULT_TEST_VLLM_PYTHON``,
``~/.cache/sndr/vllm-0.32.0-venv/bin/python``.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from vllm_env import HOOK_PATCHES

pytestmark = pytest.mark.vllm_install

SCHED = "vllm/v1/core/sched/scheduler.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"

CHILD = '''
def child(q):
    import os
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    import sndr.startup.hook as h
    from vllm.v1.core.sched import scheduler
    q.put({"pid": os.getpid(), "ppid": os.getppid(), "digest": h._STATE.digest, "mode": h._STATE.mode,
           "probe": scheduler.sndr_probe(),
           "mark": getattr(scheduler.Scheduler._update_after_schedule, "__sndr_patch__", None),
           "loader": type(scheduler.__spec__.loader).__name__})
'''

PARENT = CHILD + '''
if __name__ == "__main__":
    import json, os, traceback
    import multiprocessing as mp
    from types import SimpleNamespace
    import vllm
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    import sndr.startup.hook as h
    from vllm.v1.core.sched import scheduler
    Scheduler = scheduler.Scheduler
    # Call the wrapped real method: its counter proves the runtime patch runs, its body still runs.
    fake = SimpleNamespace(requests={}, defer_block_free=False)
    Scheduler._update_after_schedule(fake, SimpleNamespace(num_scheduled_tokens={}))
    out = {"pid": os.getpid(), "mode": h._STATE.mode, "digest": h._STATE.digest, "missing": h._STATE.missing,
           "problems": h._STATE.problems, "register_ms": h._STATE.register_ms,
           "probe": scheduler.sndr_probe(), "calls": Scheduler._update_after_schedule.sndr_calls,
           "body_ran": fake.finished_req_ids == set(), "loader": type(scheduler.__spec__.loader).__name__}
    if os.environ.get("CHECK_TRACEBACK"):
        from vllm.v1.worker import gpu_model_runner
        try:
            gpu_model_runner.sndr_traceback_probe()
        except RuntimeError:
            out["tb"] = traceback.format_exc()
        out["runner_loader"] = type(gpu_model_runner.__spec__.loader).__name__
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    out["child"] = q.get(timeout=900)
    p.join()
    print("OUT" + json.dumps(out))
'''


def _out(proc) -> dict:
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1]
    return json.loads(line[3:])


def _py_bytes(site) -> dict[str, str]:
    root = site / "vllm"
    return {str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}


def _target_pycs(site) -> dict:
    out = {}
    for rel in (SCHED, RUNNER):
        cache = (site / rel).parent / "__pycache__"
        for p in cache.glob((site / rel).stem + ".*.pyc"):
            st = p.stat()
            out[str(p)] = (st.st_ino, st.st_mtime_ns)
    return out


def _records(run_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("*.json"))]


def _replace(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_on_disk_mode_every_process_attests_the_same_digest(make_vllm_env, capsys):
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    env = make_vllm_env()
    report = run_apply(env.site, load_patch_set(HOOK_PATCHES, packs=False), environ={})
    assert report.ok, report.model_dump_json(indent=1)
    ledger = json.loads((env.site / ".sndr" / "ledger.json").read_text())
    out = _out(env.run(PARENT))
    assert out["mode"] == "disk" and out["missing"] == [] and out["problems"] == []
    assert out["probe"] == "H0001 active" and out["calls"] == 1 and out["body_ran"]
    assert out["loader"] == "SourceFileLoader"
    child = out["child"]
    assert child["ppid"] == out["pid"] and child["mode"] == "disk" and child["mark"] == "H0003/count"
    assert child["digest"] == out["digest"] == ledger["patch_set_digest"]
    run_dir = Path(env.extra_env["SNDR_RUN_DIR"])
    recs = _records(run_dir)
    assert sorted(r["pid"] for r in recs) == sorted([out["pid"], child["pid"]])
    assert {r["patch_set_digest"] for r in recs} == {ledger["patch_set_digest"]}
    assert all(r["missing_required"] == [] for r in recs)
    assert sndr_main(["status", "--run-dir", str(run_dir)]) == 0
    assert capsys.readouterr().out.count(" disk ") == 2
    # Tamper with one patched file: status re-hashes the tree and fails.
    sched = env.site / SCHED
    _replace(sched, sched.read_text() + "\n# tampered\n")
    assert sndr_main(["status", "--run-dir", str(run_dir)]) == 1
    assert "scheduler.py: changed since it was patched" in capsys.readouterr().out


def test_in_memory_mode_patches_without_touching_the_tree(make_vllm_env, capsys):
    env = make_vllm_env()
    before = _py_bytes(env.site)
    pycs_before = _target_pycs(env.site)
    assert sndr_main(["hook", "install", "--site", str(env.site)]) == 0
    out = _out(env.run(PARENT, CHECK_TRACEBACK="1"))
    assert out["mode"] == "memory" and out["missing"] == [], out
    assert out["probe"] == "H0001 active" and out["loader"] == "PatchedLoader" and out["calls"] == 1
    assert out["runner_loader"] == "PatchedLoader"
    # The traceback names the real file and shows the patched line that raised.
    assert f'File "{env.site / RUNNER}", line' in out["tb"]
    assert 'raise RuntimeError("sndr traceback probe H0002")' in out["tb"]
    child = out["child"]  # spawn: a fresh interpreter, hooked by the .pth
    assert child["loader"] == "PatchedLoader" and child["probe"] == "H0001 active" and child["mode"] == "memory"
    assert child["digest"] == out["digest"]
    assert _py_bytes(env.site) == before
    assert not (env.site / ".sndr").exists()
    assert _target_pycs(env.site) == pycs_before  # no bytecode written for the patched modules
    run_dir = Path(env.extra_env["SNDR_RUN_DIR"])
    assert sndr_main(["status", "--run-dir", str(run_dir)]) == 0
    # Warm start: served from the code cache, same answers.
    out2 = _out(env.run(PARENT))
    assert out2["probe"] == "H0001 active" and out2["digest"] == out["digest"] and out2["missing"] == []


def test_runtime_binding_check_refuses_a_changed_signature(make_vllm_env, tmp_path):
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    env = make_vllm_env()
    assert run_apply(env.site, load_patch_set(HOOK_PATCHES, packs=False), environ={}).ok
    bad = tmp_path / "bad-patches"
    shutil.copytree(HOOK_PATCHES, bad)
    p = bad / "H0003-count-update-after-schedule.toml"
    p.write_text(p.read_text().replace('"(self, scheduler_output)"', '"(self, scheduler_output, budget)"'))
    expected = ("signature of vllm.v1.core.sched.scheduler:Scheduler._update_after_schedule is "
                "(self, scheduler_output), the patch declares (self, scheduler_output, budget)")
    # The planner (apply, preflight) refuses it statically, with the same words...
    dry = run_apply(env.site, load_patch_set(bad, packs=False), dry_run=True, environ={})
    assert not dry.ok and any(expected in pr.message for pr in dry.problems)
    code = '''
        import vllm.plugins
        vllm.plugins.load_general_plugins()
        from vllm.v1.core.sched.scheduler import Scheduler
        print("MARK", getattr(Scheduler._update_after_schedule, "__sndr_patch__", None))
    '''
    # ...and so does the process: loudly, the method untouched.
    proc = env.run(code, SNDR_PATCHES=str(bad))
    assert "MARK None" in proc.stdout
    assert expected in proc.stderr and "H0003/count" in proc.stderr
    # Under SNDR_STRICT=1, vLLM's plugin loading raises: startup stops.
    proc = env.run(code, check=False, SNDR_PATCHES=str(bad), SNDR_STRICT="1")
    assert proc.returncode != 0
    assert "StrictError" in proc.stderr and expected in proc.stderr and "refusing to start" in proc.stderr
