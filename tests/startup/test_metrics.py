"""Patch-set metrics (sndr.startup.metrics): facts, the textfile writer, and publish() in multiprocess mode.

The end-to-end test through vLLM's own registry with three live processes is
tests/e2e/test_fleet_metrics.py; these run without vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sndr.startup.metrics import facts_of_record, write_textfile

REPO = Path(__file__).resolve().parents[2]

RECORD = {"pid": 4242, "role": "engine_core", "mode": "disk", "vllm_version": "0.32.0",
          "patch_set_digest": "ab" * 32, "enabled": ["PB0001", "PB0002", "PG0001"], "gated": ["PK0001", "PK0002"],
          "missing_required": ["PB0002: vllm/x.py changed since apply", "PB0002: vllm/y.py changed since apply"],
          "runtime": [{"verdict": "applied"}, {"verdict": "pending"}, {"verdict": "applied"}]}


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_facts_count_patches_not_lines():
    f = facts_of_record(RECORD)
    # Two missing lines name one patch: one missing patch, two active of three enabled.
    assert (f.active, f.missing, f.gated, f.runtime_active) == (2, 1, 2, 2)
    assert (f.digest, f.pin, f.mode, f.role, f.pid) == ("ab" * 32, "0.32.0", "disk", "engine_core", 4242)


def test_textfile_parses_and_names_every_process(tmp_path):
    path = tmp_path / "sndr.prom"
    other = dict(RECORD, pid=4243, role="worker", missing_required=[])
    write_textfile(str(path), [RECORD, other], findings=["pid 4242 (engine_core): missing PB0002"])
    got = _samples(path.read_text())
    info = got["sndr_patch_set_info"]
    assert sorted(lab["pid"] for lab, _ in info) == ["4242", "4243"]
    assert {lab["digest"] for lab, _ in info} == {"ab" * 32} and all(v == 1 for _, v in info)
    assert sorted((lab["pid"], v) for lab, v in got["sndr_patches_missing"]) == [("4242", 1), ("4243", 0)]
    assert got["sndr_status_ok"] == [({}, 0)] and got["sndr_status_findings"] == [({}, 1)]


def test_textfile_is_replaced_atomically_and_never_follows_a_planted_temp_link(tmp_path):
    path = tmp_path / "sndr.prom"
    path.write_text("old\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    ino = path.stat().st_ino
    write_textfile(str(path), [RECORD], findings=[])
    assert path.stat().st_ino != ino  # a new inode renamed into place, never written in place
    assert "sndr_status_ok 1.0" in path.read_text()
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sndr.prom", "victim"]  # no temp file left


def test_publish_in_multiprocess_mode_writes_liveall_samples(tmp_path):
    """publish() in a process where PROMETHEUS_MULTIPROC_DIR is set before prometheus_client loads."""
    rec_file = tmp_path / "record.json"
    rec_file.write_text(json.dumps(RECORD))
    prom = tmp_path / "prom"
    prom.mkdir()
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from sndr.startup import metrics
        rec = json.load(open({str(rec_file)!r}))
        assert metrics.publish(rec)
        rec["patch_set_digest"] = "cd" * 32  # a new digest replaces the info sample, never adds a second
        assert metrics.publish(rec)
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        sys.stdout.write(generate_latest(reg).decode())
    """)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(prom))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = _samples(proc.stdout)
    info = [(lab, v) for lab, v in got["sndr_patch_set_info"] if v == 1]
    assert len(info) == 1 and info[0][0]["digest"] == "cd" * 32 and info[0][0]["role"] == "engine_core"
    assert info[0][0]["pid"].isdigit()  # added by the multiprocess collector
    assert [v for _, v in got["sndr_patches_missing"]] == [1]
    assert any(p.name.startswith("gauge_liveall_") for p in prom.iterdir())


def test_publish_costs_nothing_without_prometheus(tmp_path):
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(REPO)!r})
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        from sndr.startup import metrics
        print("OUT" + json.dumps([metrics.publish({{"pid": 1}}), "prometheus_client" in sys.modules]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.split("OUT", 1)[1]) == [False, False]  # not even imported


def test_a_missing_runtime_edit_counts_its_patch_once_as_status_does():
    """`PK0002/forward: ...` counted PK0002 active in the gauges (5 active + 31 missing of 35) while the
    status line said 4/35 (the new-user review, stop 44): one reading of the entries now, attest.missing_patch_id."""
    from sndr.startup.status import active_summary

    rec = {"enabled": ["PK0001", "PK0002", "PX0003"], "patch_set_digest": "d" * 64,
           "missing_required": ["PK0002/forward: target signature changed", "PK0002/build: gone"]}
    facts = facts_of_record(rec)
    assert (facts.active, facts.missing) == (2, 1)
    assert "active 2/3 patches; NOT active: PK0002" in active_summary(rec)
