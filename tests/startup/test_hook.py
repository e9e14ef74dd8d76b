"""register(), attestations, ``sndr status`` and ``sndr hook install|uninstall`` on synthetic trees."""

from __future__ import annotations

import json
import os
import stat

import pytest

from hook_fixtures import REPO, Box, box, out_of, replace_file  # noqa: F401 (box is a fixture)
from sndr.__main__ import main as sndr_main
from sndr.startup.hook import PTH_NAME, PTH_TEXT

REGISTER = """
    import json, sys
    import vllm
    import sndr.startup.hook as h
    h.register()
    h.register()  # idempotent
    import vllm.engine as e
    st = h._STATE
    out = {"mode": st.mode, "missing": st.missing, "problems": st.problems, "digest": st.digest,
           "answer": e.answer(), "step": e.Engine().step(1), "calls": getattr(e.Engine.step, "sndr_calls", None),
           "ms": st.register_ms, "planner": "sndr.plan" in sys.modules, "pydantic": "pydantic" in sys.modules}
    print("OUT" + json.dumps(out))
"""



def test_register_on_a_patched_tree_attests_once(box):
    box.apply()
    out = out_of(box.py(REGISTER))
    assert out["mode"] == "disk" and out["missing"] == [] and out["problems"] == []
    assert out["answer"] == 42 and out["step"] == 2 and out["calls"] == 1  # runtime patch deferred, then applied
    [rec] = box.records()
    assert rec["patch_set_digest"] == box.ledger()["patch_set_digest"] == out["digest"]
    assert rec["role"] == "main" and rec["pid"] > 0 and rec["ppid"] > 0 and rec["mode"] == "disk"
    assert rec["counts"]["applied"] == 4 and rec["counts"]["runtime_applied"] == 1
    assert rec["runtime"][0]["verdict"] == "applied"  # the record is rewritten when the deferred patch lands
    assert rec["enabled"] == ["F0001", "F0002", "F0003"]
    assert stat.S_IMODE(os.stat(box.run_dir).st_mode) == 0o700
    # Warm: the second process neither plans nor loads pydantic models.
    out = out_of(box.py(REGISTER))
    assert out["planner"] is False and out["pydantic"] is False and out["missing"] == []
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 0


def test_tampered_file_is_missing_and_status_fails(box, capsys):
    box.apply()
    box.py(REGISTER)
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 0
    eng = box.root / "vllm" / "engine.py"
    replace_file(eng, eng.read_text() + "# tampered\n")
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 1  # re-hashes the tree even before a new process
    assert "changed since it was patched" in capsys.readouterr().out
    proc = box.py(REGISTER)
    out = out_of(proc)
    assert out["missing"] == ["F0001: vllm/engine.py changed since apply"]
    assert "NOT active" in proc.stderr and "SNDR_STRICT=1" in proc.stderr
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert proc.returncode != 0
    assert "StrictError" in proc.stderr and "F0001: vllm/engine.py changed since apply" in proc.stderr
    assert "refusing to start vLLM" in proc.stderr


def test_processes_that_disagree_fail_status(box, capsys):
    box.apply()
    box.py(REGISTER)
    out = out_of(box.py(REGISTER, SNDR_ENABLE_F0003="0"))
    assert out["calls"] is None  # runtime patch gated off in that process
    assert "F0003" not in json.dumps(out["missing"])
    assert "this process enables patch set" in out["problems"][0]
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 1
    text = capsys.readouterr().out
    assert "disagree" in text and text.count("pid ") >= 2


def test_one_process_on_another_set_than_the_ledger_fails_status(box, capsys):
    """Every process agrees with the others but not with the tree: verify fails, so status must too."""
    box.apply()
    out = out_of(box.py(REGISTER, SNDR_ENABLE_F0003="0"))
    assert "this process enables patch set" in out["problems"][0]
    assert len(box.records()) == 1
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 1
    text = capsys.readouterr().out
    assert f"enables patch set {out['digest'][:12]} but the tree was patched with " \
           f"{box.ledger()['patch_set_digest'][:12]}" in text


def test_unpatched_tree_reports_every_text_patch_missing(box):
    out = out_of(box.py(REGISTER))
    assert out["mode"] == "none"
    assert sorted(m.split(":")[0] for m in out["missing"]) == ["F0001", "F0002"]
    assert out["calls"] == 1  # runtime patches still apply
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert proc.returncode != 0 and "no ledger" in proc.stderr


def test_in_memory_mode_attests_what_it_served(box):
    proc = box.py("""
        from sndr.startup import importer
        importer.install(memory=True)
    """ + REGISTER.replace("\n    ", "\n        "))
    out = out_of(proc)
    assert out["mode"] == "memory" and out["missing"] == [] and out["answer"] == 42 and out["calls"] == 1
    [rec] = box.records()
    assert rec["mode"] == "memory" and rec["text"]["served"] == {"vllm.engine": "vllm/engine.py"}
    assert not (box.root / ".sndr").exists()
    # it attests the bytes its plan was made from: a file changed since is a status finding (the new-user
    # review, stop 44: an in-memory process and a later one served different code under one digest, "ok")
    assert "vllm/engine.py" in rec["files"] and all(len(v) == 64 for v in rec["files"].values() if v)
    from sndr.startup.status import attested_vs_tree

    rec["_alive"] = True
    assert attested_vs_tree([rec]) == []
    engine = box.root / "vllm" / "engine.py"
    engine.write_text(engine.read_text() + "# changed under a running process\n")
    [finding] = attested_vs_tree([rec])
    assert "its in-memory patches were planned from changed since it attested: vllm/engine.py" in finding


def test_runtime_drift_is_loud_and_fatal_under_strict(box):
    box.apply()
    p = box.patches / "F0003-count.toml"
    p.write_text(p.read_text().replace('"(self, n)"', '"(self, n, extra)"'))
    proc = box.py(REGISTER)
    assert out_of(proc)["calls"] is None
    [rec] = box.records()
    assert any("F0003/count: runtime drifted" in m and "the patch declares (self, n, extra)" in m
               for m in rec["missing_required"])
    assert "runtime patch F0003/count" in proc.stderr and "WITHOUT it" in proc.stderr
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert proc.returncode != 0 and "F0003/count: runtime drifted" in proc.stderr


def test_corrupt_ledger_never_raises_unless_strict(box):
    box.apply()
    (box.root / ".sndr" / "ledger.json").write_text("{not json")
    out = out_of(box.py(REGISTER))
    assert any("ledger" in m for m in out["missing"])
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert proc.returncode != 0 and "ledger" in proc.stderr


def test_strict_typo_is_treated_as_strict(box):
    proc = box.py(REGISTER, check=False, SNDR_STRICT="ture")
    assert proc.returncode != 0 and "treating it as 1" in proc.stderr


def test_fork_child_gets_its_own_record(box):
    box.apply()
    box.py("""
        import os
        import vllm, sndr.startup.hook as h
        h.register()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    recs = box.records()
    assert len(recs) == 2
    parent = next(r for r in recs if not r["forked_from"])
    child = next(r for r in recs if r["forked_from"])
    assert child["forked_from"] == parent["pid"] == child["ppid"]
    assert child["patch_set_digest"] == parent["patch_set_digest"] and child["role"] == "forked"


def test_unsafe_run_dir_is_refused_loudly(box, capsys):
    box.apply()
    box.run_dir.mkdir(mode=0o777)
    os.chmod(box.run_dir, 0o777)
    proc = box.py(REGISTER)
    assert "NOT attested" in proc.stderr and "writable by group or others" in proc.stderr
    assert box.records() == []
    assert sndr_main(["status", "--run-dir", str(box.run_dir)]) == 2
    assert "cannot be trusted" in capsys.readouterr().err


def test_status_with_no_records_is_a_finding(tmp_path, capsys):
    assert sndr_main(["status", "--run-dir", str(tmp_path / "none")]) == 1
    assert "no attestation records" in capsys.readouterr().out


def test_status_json_and_prune(box, capsys):
    box.apply()
    box.py(REGISTER)
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and len(data["processes"]) == 1
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--prune"]) == 1  # the process exited: nothing left
    assert box.records() == []


def test_status_outputs_are_checked_before_prune_and_stdout_holds_one_document(box, tmp_path, capsys):
    """``status --prune --prometheus LINK`` deleted the records, then refused the symlinked output; and
    ``--json - --prometheus -`` wrote the gauges and the JSON document to stdout together (exit 0), while
    ``--prometheus -`` alone mixed the gauges with the text report. Now: every output is checked before any
    work, two stdout outputs are refused (``stdout_conflict``), and with ``--prometheus -`` stdout holds
    the gauges only (the report goes to stderr)."""
    pytest.importorskip("prometheus_client")
    box.apply()
    box.py(REGISTER)
    records = box.records()
    assert records
    link = tmp_path / "sndr.prom"
    link.symlink_to(tmp_path / "elsewhere.prom")
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--prune", "--prometheus", str(link)]) == 2
    assert "output_refused" in capsys.readouterr().err
    assert box.records() == records and not (tmp_path / "elsewhere.prom").exists()
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--json", "-", "--prometheus", "-"]) == 2
    out = capsys.readouterr().out
    data = json.loads(out)  # one document: the refusal
    assert data["ok"] is False and [p["code"] for p in data["problems"]] == ["stdout_conflict"]
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--prometheus", "-"]) == 0
    got = capsys.readouterr()
    assert got.out.strip() and all(line.startswith(("# ", "sndr_")) for line in got.out.splitlines()), got.out
    assert "sndr_status_ok 1.0" in got.out and "sndr status:" in got.err


def test_status_prometheus_without_prometheus_client_is_refused_before_prune(box, tmp_path, monkeypatch, capsys):
    """Without prometheus_client, ``status --prune --prometheus FILE`` deleted the exited processes' records
    and only then said "--prometheus needs prometheus_client" (exit 2). Refused before any work now."""
    import sys

    box.apply()
    box.py(REGISTER)
    records = box.records()
    assert records
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client -> ImportError
    assert sndr_main(["status", "--run-dir", str(box.run_dir), "--prune", "--prometheus",
                      str(tmp_path / "sndr.prom")]) == 2
    assert "extra_missing" in capsys.readouterr().err
    assert box.records() == records and not (tmp_path / "sndr.prom").exists()


def test_hook_install_and_uninstall(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    assert sndr_main(["hook", "install", "--site", str(site)]) == 0
    assert (site / PTH_NAME).read_text() == PTH_TEXT
    lines = [ln for ln in PTH_TEXT.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["import sndr._boot"]  # the .pth does nothing but import sndr's boot module
    assert sndr_main(["hook", "install", "--site", str(site)]) == 0  # idempotent
    assert sndr_main(["hook", "uninstall", "--site", str(site)]) == 0
    assert not (site / PTH_NAME).exists()
    assert sndr_main(["hook", "uninstall", "--site", str(site)]) == 0
    assert sndr_main(["hook", "install", "--site", str(tmp_path / "missing")]) == 2


def test_hook_install_into_a_site_without_sndr_says_so(tmp_path, capsys):
    """``hook install --site S`` (or the default site, found through a vLLM that lives in another
    environment) wrote the .pth into a site-packages whose interpreters cannot import sndr: each of them then
    prints an import error at start and runs vLLM unpatched, where SNDR_STRICT=1 cannot stop it (found by
    installing the hook from one venv for a vLLM of another). Still written (the operator may install sndr
    next), but said; a site that holds sndr (installed, or an editable install's finder) is not."""
    site = tmp_path / "site"
    site.mkdir()
    assert sndr_main(["hook", "install", "--site", str(site)]) == 0
    err = capsys.readouterr().err
    assert f"note: {site} holds no sndr package" in err and "pip install sndr" in err, err
    for marker in ("sndr", "sndr-0.1.0.dist-info", "__editable___sndr_0_1_0_finder.py"):
        other = tmp_path / marker.replace(".", "_")
        (other / marker).mkdir(parents=True)
        assert sndr_main(["hook", "install", "--site", str(other)]) == 0
        assert "holds no sndr package" not in capsys.readouterr().err, marker


def test_register_never_raises_outside_a_vllm_process(tmp_path):
    box = Box(tmp_path)
    proc = box.py("""
        import sndr.startup.hook as h
        h.register()
        print("OUT{}")
    """, PYTHONPATH=str(REPO), SNDR_TREE=str(tmp_path / "nowhere"))
    assert proc.returncode == 0


def test_main_dispatches_status_and_hook(tmp_path):
    from sndr.__main__ import main

    assert main(["status", "--run-dir", str(tmp_path)]) == 1
    assert main(["hook", "install", "--site", str(tmp_path)]) == 0


def test_fix_hint_tells_a_restored_file_from_a_tampered_one(box):
    """QA: a file changed after apply got 'fix: run python -m sndr.apply (it patches again files a
    reinstall or a restore put back)', and that apply refuses with modified_since_apply."""
    eng = box.root / "vllm" / "engine.py"
    pristine = eng.read_text()
    box.apply()
    replace_file(eng, pristine)  # a restore: back to pristine
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert "back to pristine" in proc.stderr
    assert "fix: run `python -m sndr.apply` (it patches again" in proc.stderr and "--force" not in proc.stderr
    replace_file(eng, pristine + "# tampered\n")  # changed by someone else
    proc = box.py(REGISTER, check=False, SNDR_STRICT="1")
    assert "changed by someone else since apply" in proc.stderr
    assert "vllm/engine.py changed since apply by someone else: inspect the change" in proc.stderr
    assert "`python -m sndr.apply --force`" in proc.stderr
    assert "fix: run `python -m sndr.apply` (it patches again" not in proc.stderr


def test_hook_without_vllm_names_its_own_options(tmp_path, capsys):
    """No vLLM for --python: one problem naming hook's options (--python, --site), its hint on its own line,
    rendered by the command boundary (not the tree commands' --tree hint folded into one line)."""
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\necho '{}'\n")  # an interpreter whose vllm lookup finds nothing
    py.chmod(0o755)
    assert sndr_main(["hook", "install", "--python", str(py)]) == 2
    err = capsys.readouterr().err
    assert "(vllm_not_found)\n    hint: pass --python" in err and "--site" in err, err
    assert "--tree" not in err, err
