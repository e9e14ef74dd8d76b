"""Fleet view on a real vLLM 0.32.0 install: sndr's gauges in vLLM's own ``/metrics`` registry.

Three processes (a parent and two spawned children, as vLLM's API server,
engine core and worker are) share one ``PROMETHEUS_MULTIPROC_DIR`` and call
vLLM's plugin loader. The parent then collects through vLLM's
``get_prometheus_registry()`` while the children are alive, and the exposition
is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import json
import os

import pytest

from vllm_env import HOOK_PATCHES

pytestmark = pytest.mark.vllm_install

SCHED = "vllm/v1/core/sched/scheduler.py"

FLEET = r'''
import json, os, sys
import multiprocessing as mp


def child(name, ready, done):
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    ready.put(os.getpid())
    done.wait(600)


if __name__ == "__main__":
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    import sndr.startup.hook as h
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Event()
    kids = [ctx.Process(target=child, args=(n, ready, done), name=n) for n in ("EngineCore_DP0", "VllmWorker-0")]
    for k in kids:
        k.start()
    pids = sorted(ready.get(timeout=600) for _ in kids)
    # The runtime patch is deferred until its module is imported: only the parent installs it,
    # and its gauge must follow (published again on change).
    import vllm.v1.core.sched.scheduler  # noqa: F401
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.v1.metrics.prometheus import get_prometheus_registry
    text = generate_latest(get_prometheus_registry()).decode()
    samples = []
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("sndr_"):
            samples += [{"name": s.name, "labels": s.labels, "value": s.value} for s in fam.samples]
    done.set()
    for k in kids:
        k.join(60)
    print("OUT" + json.dumps({"pid": os.getpid(), "kids": pids, "digest": h._STATE.digest,
                              "samples": samples, "text": text}))
'''


def _out(proc) -> dict:
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1]
    return json.loads(line[3:])


def _by(samples, name):
    return [s for s in samples if s["name"] == name]


def test_every_live_process_reports_its_patch_set_in_vllms_metrics(make_vllm_env, tmp_path):
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    env = make_vllm_env()
    report = run_apply(env.site, load_patch_set(HOOK_PATCHES, packs=False), environ={})
    assert report.ok
    ledger = json.loads((env.site / ".sndr" / "ledger.json").read_text())
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    out = _out(env.run(FLEET, PROMETHEUS_MULTIPROC_DIR=str(mp_dir)))
    info = _by(out["samples"], "sndr_patch_set_info")
    # One sample per live process, each with its own pid and role, all on the ledger's digest.
    assert sorted(int(s["labels"]["pid"]) for s in info) == sorted([out["pid"], *out["kids"]]), out["text"]
    assert {s["labels"]["digest"] for s in info} == {ledger["patch_set_digest"]} == {out["digest"]}
    assert sorted(s["labels"]["role"] for s in info) == ["engine_core", "main", "worker"]
    assert {s["labels"]["mode"] for s in info} == {"disk"} and {s["labels"]["pin"] for s in info} == {"0.32.0"}
    assert all(s["value"] == 1 for s in info)
    missing = _by(out["samples"], "sndr_patches_missing")
    assert len(missing) == 3 and all(s["value"] == 0 for s in missing)
    active = _by(out["samples"], "sndr_patches_active")
    assert len(active) == 3 and all(s["value"] == len(ledger["patches"]) for s in active)
    runtime = {int(s["labels"]["pid"]): s["value"] for s in _by(out["samples"], "sndr_runtime_patches_active")}
    assert runtime == {out["pid"]: 1, **{k: 0 for k in out["kids"]}}

    # A tampered file: every process now reports the patch that is not active.
    sched = env.site / SCHED
    tmp = sched.with_name(sched.name + ".tmp")
    tmp.write_text(sched.read_text() + "\n# tampered\n")
    os.replace(tmp, sched)
    mp_dir2 = tmp_path / "prom2"
    mp_dir2.mkdir()
    out2 = _out(env.run(FLEET, PROMETHEUS_MULTIPROC_DIR=str(mp_dir2)))
    missing2 = _by(out2["samples"], "sndr_patches_missing")
    assert len(missing2) == 3 and all(s["value"] == 1 for s in missing2), out2["text"]


def test_without_prometheus_client_register_still_succeeds(make_vllm_env, tmp_path):
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    env = make_vllm_env()
    assert run_apply(env.site, load_patch_set(HOOK_PATCHES, packs=False), environ={}).ok
    code = r'''
        import sys, json
        class _Block:  # prometheus_client is not importable in this process
            def find_spec(self, name, path=None, target=None):
                if name == "prometheus_client" or name.startswith("prometheus_client."):
                    raise ImportError("blocked for the test")
                return None
        sys.meta_path.insert(0, _Block())
        import sndr.startup.hook as h
        h.register()
        from sndr.startup import metrics
        print("OUT" + json.dumps({"mode": h._STATE.mode, "missing": h._STATE.missing,
                                  "gauges": metrics._GAUGES, "loaded": "prometheus_client" in sys.modules}))
    '''
    out = _out(env.run(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path)))
    assert out["mode"] == "disk" and out["missing"] == []
    assert out["gauges"] == {} and out["loaded"] is False
