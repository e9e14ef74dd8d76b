"""``python -m sndr list``: rows, the verdict column and the filters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.listing import list_rows, render_table
from sndr.load import load_patch_set
from sndr.plan import build_plan
from sndr.tree import open_tree

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return load_patch_set(packs=False)


def test_rows_cover_every_patch_in_order(shipped):
    rows = list_rows(shipped)
    assert [r.id for r in rows] == [p.id for p in shipped.patches]
    pn4 = next(r for r in rows if r.id == "PN0004")
    assert pn4.kind == "text" and pn4.default is True and pn4.upstream == ["vllm#52412"]
    assert pn4.files == ["vllm/v1/core/sched/scheduler.py"]
    assert pn4.verdict is None and "verdict" not in pn4.to_json()
    pr2 = next(r for r in rows if r.id == "PR0002")
    assert pr2.files == ["runtime vllm.v1.attention.ops.triton_turboquant_decode:triton_turboquant_decode_attention"]


def test_rows_with_a_plan_carry_verdicts_and_filter(shipped, vllm_candidate_root):
    tree = open_tree(vllm_candidate_root)
    plan = build_plan(shipped, tree.read_text, tree.version, environ={}, check_compile=False)
    rows = list_rows(shipped, plan)
    by_id = {r.id: r for r in rows}
    assert by_id["PN0001"].verdict == "merged" and by_id["PN0001"].edit_verdicts == ["merged"]
    assert by_id["PG0001"].verdict == "applies"
    merged = list_rows(shipped, plan, "merged")
    assert {r.id for r in merged} >= {p.id for p in shipped.patches if p.id.startswith("PN")}
    assert [r.id for r in list_rows(shipped, plan, "drifted")] == ["PR0001"]
    assert list_rows(shipped, plan, "ambiguous") == []


def test_table_has_one_line_per_patch_plus_files(shipped):
    rows = list_rows(shipped)[:3]
    text = render_table(rows, with_verdict=False)
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "KIND", "DEFAULT", "UPSTREAM", "TITLE"]
    assert sum(1 for ln in lines if ln.startswith("P")) == 3
    assert len(lines) == 1 + 3 + sum(len(r.files) for r in rows)


def test_cli_plain(capsys):
    assert sndr_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "PN0004" in out and "vllm#52412" in out and "vllm/v1/core/sched/scheduler.py" in out
    assert out.rstrip().splitlines()[-1].startswith(f"{len(load_patch_set().patches)} patch(es)")


def test_cli_json_with_tree_on_the_pin(capsys, vllm_pin_root):
    assert sndr_main(["list", "--tree", str(vllm_pin_root), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm_version"] == "0.32.0"
    verdicts = {p["id"]: p["verdict"] for p in doc["patches"]}
    assert all(v in ("applies", "applied", "gated") for v in verdicts.values()), verdicts
    assert verdicts["PN0001"] == "applies"


def test_cli_verdict_filter_and_kind(capsys, vllm_candidate_root):
    assert sndr_main(["list", "--tree", str(vllm_candidate_root), "--verdict", "drifted"]) == 0
    out = capsys.readouterr().out
    assert "VERDICT" in out and "PR0001" in out and "PN0001" not in out
    assert sndr_main(["list", "--tree", str(vllm_candidate_root), "--kind", "runtime", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["id"] for p in doc["patches"]} == {"PR0001", "PR0002"}


def test_a_filter_that_matches_nothing_says_so_in_its_summary(capsys, vllm_candidate_root):
    """``list --tree T --verdict conflict`` with no match printed the summary "0 patch(es): ; " (two empty
    lists); now one plain line."""
    assert sndr_main(["list", "--tree", str(vllm_candidate_root), "--verdict", "conflict"]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == "0 patch(es) with verdict conflict", last


def test_cli_usage_errors(capsys):
    assert sndr_main(["list", "--verdict", "merged"]) == 2
    assert "--verdict needs --tree" in capsys.readouterr().err
    assert sndr_main(["list", "--tree", ".", "--verdict", "nonsense"]) == 2
    assert "--verdict 'nonsense': choose from applies, applied, merged" in capsys.readouterr().err
    assert sndr_main(["list", "--patches", "/nonexistent/patches"]) == 2


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "sndr", "list", "--kind", "runtime"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "PR0001" in proc.stdout and "PN0001" not in proc.stdout


def test_list_on_a_tree_sndr_patched_reads_its_pristine_copies(capsys, pin_tree, shipped):
    """QA: on a tree sndr patched, list --tree said '10 applied, 3 gated, 22 merged' and called
    sndr's own patches upstream merges. It reads the pristine copies in .sndr/objects (as apply
    and verify do) and says the tree is patched by sndr, with the ledger's enabled-set digest."""
    from sndr.apply import run_apply

    tree = pin_tree
    before_rc = sndr_main(["list", "--tree", str(tree), "--json", "-"])
    before = {r["id"]: r["verdict"] for r in json.loads(capsys.readouterr().out)["patches"]}
    report = run_apply(tree, shipped, environ={})
    assert report.ok, report.problems
    assert sndr_main(["list", "--tree", str(tree), "--json", "-"]) == before_rc == 0
    doc = json.loads(capsys.readouterr().out)
    after = {r["id"]: r["verdict"] for r in doc["patches"]}
    assert "merged" not in after.values()
    assert after == {i: ("applied" if v == "applies" else v) for i, v in before.items()}
    assert doc["patched_by_sndr"]["enabled_set_digest"] == report.patch_set_digest
    assert doc["patched_by_sndr"]["files_not_holding_patched_bytes"] == []
    sndr_main(["list", "--tree", str(tree)])
    out = capsys.readouterr().out
    assert f"patched by sndr: enabled set {report.patch_set_digest[:12]}" in out
    assert "merged" not in out.splitlines()[-1]
