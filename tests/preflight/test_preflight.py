"""Bump preflight on real vLLM trees (0.32.0 -> 0.33.0 and 0.10.0 -> 0.10.1), plus small synthetic cases.

The real-data patch sets live in tests/data/preflight/ (made by make_sets.py
from real code of the pin). Every edit's verdict on both trees is asserted.
For regions that moved or were edited upstream, the true new place is
derived here independently, with difflib, and the top suggestion must
overlap it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.errors import SndrError
from sndr.load import load_patch_set
from sndr.model import Verdict
from sndr.preflight.analysis import exit_code, run_preflight
from sndr.preflight.annotations import github_annotations, render_sarif
from sndr.preflight.models import PreflightReport
from sndr.preflight.render import render_markdown
from tests.preflight_oracle import true_location

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight"
ROOT = Path(__file__).resolve().parents[2]

# (patch, edit) -> (pin verdict, candidate verdict, what happened upstream)
EXPECTED_032_033 = {
    ("PF01", "popleft"): ("applies", "applies", "survives"),
    ("PF02", "free"): ("applies", "applies", "survives"),
    ("PF03", "shortfall"): ("applies", "drifted", "moved"),
    ("PF04", "fits"): ("applies", "drifted", "moved"),
    ("PF05", "page"): ("applies", "drifted", "moved"),
    ("PF06", "worker"): ("applies", "drifted", "moved"),  # and edited in its new home
    ("PF07", "extra"): ("applies", "drifted", "edited"),
    ("PF08", "sig"): ("applies", "drifted", "edited"),
    ("PF09", "clamp"): ("applies", "drifted", "edited"),
    ("PF10", "mtp"): ("applies", "drifted", "deleted"),
    ("PF11", "partition"): ("applies", "drifted", "deleted"),
    ("PF12", "lookahead"): ("applies", "merged", "backport"),
    ("PF13", "import"): ("applies", "merged", "backport"),
    ("PF13", "use"): ("applies", "merged", "backport"),
    ("PF14", "arg"): ("applies", "applied", "backport"),  # no marker: the replacement text is upstream
    ("PF15", "total"): ("applies", "drifted", "moved"),
    ("PF16", "log"): ("applies", "drifted", "chain"),
    ("PF17", "probe"): ("applies", "merged", "retire"),
    ("PF18", "detail"): ("applies", "drifted", "chain"),
    ("PF19", "reconcile"): ("applies", "optional_absent", "edited"),
    ("PF20", "mode"): ("applies", "ambiguous", "ambiguous"),
    ("PF21", "kernel"): ("applies", "applies", "survives"),
    ("PF22", "v032"): ("applies", "optional_absent", "variant"),
    ("PF22", "v033"): ("optional_absent", "applies", "variant"),
    ("PF23", "hasher"): ("applies", "drifted", "runtime"),
    ("PF23", "estimate"): ("applies", "drifted", "runtime-moved"),
    ("PF23", "hash"): ("applies", "applies", "runtime"),
    ("PF24", "eagle"): ("merged", "applies", "reverted"),
    ("PF25", "tweak"): ("applies", "gated", "gated"),
    ("PF26", "moved"): ("applies", "gated", "gated-moved"),
    ("PF27", "port"): ("applies", "file_missing", "moved"),
    ("PF28", "parse"): ("applies", "file_missing", "moved"),
    ("PF29", "create"): ("applies", "applies", "survives"),
    ("PF30", "group"): ("applies", "gated", "gated"),  # a runtime edit: gated like a text one, named like one
}

EXPECTED_0100_0101 = {
    ("PQ01", "fp8"): ("applies", "file_missing", "moved"),
    ("PQ02", "seed"): ("applies", "file_missing", "moved"),
    ("PQ03", "swap"): ("applies", "file_missing", "moved"),
    ("PQ04", "plugins"): ("applies", "applies", "survives"),
}


def _texts(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8")
            for p in (root / "vllm").rglob("*.py") if "__pycache__" not in p.parts}


def _edits(report: PreflightReport):
    return {(p.id, e.name): e for p in report.patches for e in p.edits}


def _anchor(patch_set, pid, name):
    p = patch_set.by_id[pid]
    for r in p.runtime:
        if r.name == name:
            return None
    return next(e.anchor for _, e in p.edits() if e.name == name)


@pytest.fixture(scope="module")
def bump(vllm_pin_root, vllm_candidate_root):
    ps = load_patch_set(DATA / "bump_032_033", packs=False)
    report = run_preflight(ps, vllm_pin_root, vllm_candidate_root, config=False)
    return ps, report, _texts(vllm_pin_root), _texts(vllm_candidate_root)


@pytest.fixture(scope="module")
def bump_010(vllm_root):
    pin, cand = vllm_root("0.10.0"), vllm_root("0.10.1")
    ps = load_patch_set(DATA / "bump_0100_0101", packs=False)
    report = run_preflight(ps, pin, cand, config=False)
    return ps, report, _texts(pin), _texts(cand)


# ---------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("case", ["bump", "bump_010"])
def test_every_verdict(case, request):
    expected = EXPECTED_032_033 if case == "bump" else EXPECTED_0100_0101
    _, report, _, _ = request.getfixturevalue(case)
    got = {k: (e.pin_verdict.value, e.verdict.value) for k, e in _edits(report).items()}
    assert got == {k: v[:2] for k, v in expected.items()}


def test_versions_and_digests(bump):
    _, report, _, _ = bump
    assert (report.pin.version, report.candidate.version) == ("0.32.0", "0.33.0")
    assert len(report.pin.tree_digest) == 64 and report.pin.tree_digest != report.candidate.tree_digest
    assert report.pin.files > 2000


def test_applies_edits_carry_line_and_qualname(bump):
    _, report, _, cand = bump
    for (pid, name), e in _edits(report).items():
        if e.verdict == Verdict.APPLIES and e.kind == "text":
            assert e.line and e.qualname is not None, (pid, name)
            anchor_first = cand[e.file].split("\n")[e.line - 1]
            assert anchor_first.strip(), (pid, name)


# ---------------------------------------------------------------------------- suggestions


def _located(case, request):
    ps, report, pin, cand = request.getfixturevalue(case)
    expected = EXPECTED_032_033 if case == "bump" else EXPECTED_0100_0101
    edits = _edits(report)
    out = []
    for key, (_, _, what) in expected.items():
        if what not in ("moved", "edited", "gated-moved", "runtime-moved"):
            continue
        e = edits[key]
        anchor = _anchor(ps, *key)
        if anchor is None:  # runtime target: its pin source head is what moved
            lines = pin[e.file].split("\n")
            anchor = "\n".join(lines[e.pin_line - 1:e.pin_line + 3]) + "\n"
        out.append((key, e, anchor, true_location(anchor, e.file, pin, cand)))
    return out


@pytest.mark.parametrize("case", ["bump", "bump_010"])
def test_top_suggestion_overlaps_the_true_location(case, request):
    located = _located(case, request)
    assert located
    misses = []
    for key, e, _anchor, truth in located:
        assert truth is not None, f"{key}: the oracle lost the region; the test data is wrong"
        rel, lo, hi = truth
        top = e.suggestions[0] if e.suggestions else None
        if top is None or top.file != rel or not (top.line <= hi and lo <= top.end_line):
            misses.append((key, truth, top and (top.file, top.line, top.end_line)))
    assert not misses


def test_suggestions_are_ranked_and_bounded(bump):
    _, report, _, _ = bump
    for e in _edits(report).values():
        assert len(e.suggestions) <= 3
        scores = [s.score for s in e.suggestions]
        assert scores == sorted(scores, reverse=True)
        assert all(0 <= s <= 100 for s in scores)
        if e.verdict in (Verdict.APPLIES, Verdict.APPLIED, Verdict.MERGED):
            assert not e.suggestions


def test_moved_regions_keep_their_qualname(bump):
    _, report, _, _ = bump
    edits = _edits(report)
    for key in [("PF03", "shortfall"), ("PF04", "fits"), ("PF06", "worker"), ("PF15", "total")]:
        top = edits[key].suggestions[0]
        assert top.file == "vllm/v1/core/kv_cache_planning.py"
        assert top.qualname == edits[key].pin_qualname
        assert "same qualname" in top.reasons and top.score >= 90


def test_renamed_and_split_files(bump, bump_010):
    edits = _edits(bump[1])
    assert edits[("PF27", "port")].suggestions[0].file == "vllm/entrypoints/common/cli_args.py"
    assert edits[("PF28", "parse")].suggestions[0].file.startswith("vllm/renderers/chat_utils/")
    old = _edits(bump_010[1])
    assert old[("PQ01", "fp8")].suggestions[0].file == "vllm/config/cache.py"
    assert old[("PQ01", "fp8")].suggestions[0].qualname == "CacheConfig._verify_cache_dtype"
    assert old[("PQ03", "swap")].suggestions[0].file == "vllm/config/cache.py"
    assert old[("PQ02", "seed")].suggestions[0].file == "vllm/config/__init__.py"


def test_deleted_regions_get_no_confident_suggestion(bump):
    ps, report, pin, cand = bump
    edits = _edits(report)
    for key in [("PF10", "mtp"), ("PF11", "partition")]:
        e = edits[key]
        assert true_location(_anchor(ps, *key), e.file, pin, cand) is None
        assert all(s.score < 80 for s in e.suggestions)


# ---------------------------------------------------------------------------- transitions and lists


def test_lists(bump):
    _, report, _, _ = bump
    ref = lambda lst: sorted((r.patch, r.name) for r in lst)  # noqa: E731
    assert ref(report.genuine_anchor_drift) == sorted(
        [("PF03", "shortfall"), ("PF04", "fits"), ("PF05", "page"), ("PF06", "worker"), ("PF07", "extra"),
         ("PF08", "sig"), ("PF09", "clamp"), ("PF10", "mtp"), ("PF11", "partition"), ("PF15", "total"),
         ("PF23", "hasher"), ("PF23", "estimate")])
    assert ref(report.retired_upstream) == sorted(
        [("PF12", "lookahead"), ("PF13", "import"), ("PF13", "use"), ("PF14", "arg"), ("PF17", "probe")])
    assert ref(report.file_missing) == [("PF27", "port"), ("PF28", "parse")]
    assert ref(report.ambiguous) == [("PF20", "mode")]
    assert ref(report.chain_broken) == [("PF16", "log"), ("PF18", "detail")]
    assert ref(report.optional_absent) == [("PF19", "reconcile")]  # the group variant switch is not a soft-skip
    assert ref(report.qualname_changed) == [("PF21", "kernel")]
    assert ref(report.newly_gated) == [("PF25", "tweak"), ("PF26", "moved"), ("PF30", "group")]
    actions = {p.id: p.action for p in report.patches}
    assert actions["PF13"] == actions["PF12"] == actions["PF17"] == "retire"
    assert actions["PF03"] == "reanchor" and actions["PF19"] == "soft_skip" and actions["PF01"] == "keep"
    assert actions["PF16"] == actions["PF20"] == actions["PF25"] == "review"


def test_chain_broken_names_both(bump):
    _, report, _, _ = bump
    edits = _edits(report)
    log = edits[("PF16", "log")].chain_broken
    assert (log.producer, log.producer_edit, log.producer_verdict) == ("PF15", "total", "drifted")
    assert "PF16" in log.message and "PF15" in log.message
    detail = edits[("PF18", "detail")].chain_broken
    assert (detail.producer, detail.producer_verdict) == ("PF17", "merged")
    assert edits[("PF16", "log")].chained_from == ["PF15"]


def test_markers_are_a_diff_between_trees(bump):
    _, report, _, _ = bump
    merged = sorted((m.patch, m.edit, m.scope) for m in report.newly_merged)
    assert merged == [("PF12", "lookahead", "edit"), ("PF13", None, "patch"), ("PF17", None, "patch")]
    assert [(m.patch, m.marker) for m in report.newly_reverted] == [("PF24", "def _uses_trailing_mtp_layers(")]
    assert all(m.candidate_present and not m.pin_present for m in report.newly_merged)


def test_scope_change_and_gates(bump):
    _, report, _, _ = bump
    edits = _edits(report)
    k = edits[("PF21", "kernel")]
    assert k.pin_qualname == "FlashInferMLASparseImpl._run_mqa_kernel"
    assert k.qualname == "FlashInferMLASparseImpl._forward_mqa_kernel"
    assert edits[("PF25", "tweak")].verdict_if_enabled == Verdict.APPLIES
    moved = edits[("PF26", "moved")]
    assert moved.verdict_if_enabled == Verdict.DRIFTED
    assert moved.suggestions[0].file == "vllm/v1/core/kv_cache_planning.py"
    assert edits[("PF22", "v032")].notes == ["group variant switched: another member matches on the candidate"]


def test_summary_and_fail_on(bump):
    _, report, _, _ = bump
    s = report.summary
    assert s.edits == len(EXPECTED_032_033) and s.patches == 30
    assert s.counts["drifted"] == 14 and s.pin_counts["applies"] == 32  # PF30's runtime edit counted on the pin
    assert s.transitions["applies->drifted"] == 14
    assert s.findings["drift"] >= 12 and s.findings["ambiguous"] == 1
    assert exit_code(report, ["drift"]) == 1
    assert exit_code(report, ["none"]) == 0
    assert s.suggestion_hits >= 14


# ---------------------------------------------------------------------------- renderings


def test_markdown(bump):
    ps, report, _, _ = bump
    md = render_markdown(report, ps)
    assert md.startswith("# sndr bump preflight: 0.32.0 -> 0.33.0")
    order = [md.index(h) for h in ("## Verdicts", "## Retire", "## Re-anchor", "## Review", "## Soft-skips")]
    assert order == sorted(order)
    assert "| drifted | 0 | 14 |" in md
    # PF06 moved and was edited: a diff; PF03 moved verbatim: said so.
    assert "```diff\n--- vllm/v1/core/kv_cache_utils.py:2445 (anchor, pin)\n" in md
    assert "+++ vllm/v1/core/kv_cache_planning.py:1370-1378 (candidate)" in md
    assert "+            builder, vllm_config, groups, avail_mem" in md
    assert "the anchor's text, unchanged: only its place moved" in md
    assert "PF16 `log`: broken by the chain" in md


def test_json_roundtrip_and_schema(bump):
    _, report, _, _ = bump
    data = json.loads(report.model_dump_json())
    for key in ("pin", "candidate", "patches", "summary", "genuine_anchor_drift", "retired_upstream",
                "newly_merged", "newly_reverted"):
        assert key in data
    e = next(x for p in data["patches"] if p["id"] == "PF03" for x in p["edits"])
    assert {"file", "name", "verdict", "pin_verdict", "suggestions"} <= set(e)
    assert {"file", "line", "qualname", "score"} <= set(e["suggestions"][0])
    assert PreflightReport.model_validate(data) == report
    schema = PreflightReport.model_json_schema()
    assert "genuine_anchor_drift" in schema["properties"]


def test_sarif_and_github(bump):
    _, report, _, _ = bump
    sarif = render_sarif(report)
    results = sarif["runs"][0]["results"]
    rules = {r["ruleId"] for r in results}
    assert {"anchor-drift", "file-missing", "chain-broken", "ambiguous", "retire", "soft-skip"} <= rules
    drift = next(r for r in results if r["partialFingerprints"]["sndrEdit"] == "PF03/shortfall")
    loc = drift["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"].endswith("PF03-explain-the-kv-memory-shortfall.toml")
    assert loc["region"]["startLine"] > 1
    lines = github_annotations(report)
    assert any(ln.startswith("::error file=") and "PF03/shortfall" in ln for ln in lines)
    assert all("\n" not in ln for ln in lines)


# ---------------------------------------------------------------------------- CLI


def test_cli_exit_codes_and_outputs(tmp_path, vllm_pin_root, vllm_candidate_root, capsys):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    args = ["--patches", str(DATA / "bump_032_033"), "--pin", str(vllm_pin_root),
            "--candidate", str(vllm_candidate_root), "--json", str(out), "--markdown", str(md), "-q", "--no-config"]
    assert sndr_main(["preflight", *args]) == 1
    assert json.loads(out.read_text())["summary"]["exit_code"] == 1
    assert md.read_text().startswith("# sndr bump preflight")
    assert sndr_main(["preflight", *(args + ["--fail-on", "none"])]) == 0
    assert sndr_main(["preflight", *(args + ["--fail-on", "bogus"])]) == 2
    assert sndr_main(["preflight", "--patches", str(DATA / "bump_032_033"), "--pin", str(tmp_path / "nope"),
                     "--candidate", str(vllm_candidate_root)]) == 2
    capsys.readouterr()


def test_cli_clean_set_exits_zero_with_config(tmp_path, vllm_pin_root, vllm_candidate_root):
    """The survivors of the 0.32.0 set only, through the real wrapper, config drift included."""
    ps_dir = tmp_path / "set"
    ps_dir.mkdir()
    for name in ("PF01", "PF02", "PF21", "PF29"):
        src = next((DATA / "bump_032_033").glob(f"{name}-*.toml"))
        (ps_dir / src.name).write_text(src.read_text())
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bump_preflight.py"), "--patches", str(ps_dir),
                           "--pin", str(vllm_pin_root), "--candidate", str(vllm_candidate_root),
                           "--json", str(out), "--fail-on", "drift,ambiguous"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["config"]["pin"] == "0.32.0" and "dependencies" in data["config"]
    # Compact terminal layout: the plain-words verdict first, the kept patches named, no empty sections.
    lines = proc.stdout.splitlines()
    assert lines[1] == "Bump clear: keep 4" and "re-anchor" not in proc.stdout
    assert "PF01, PF02, PF21, PF29" in proc.stdout and "nothing to report" in lines[-1]
    # --fail-on any: the candidate's config drift alone does not count; only watched items do (config).
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bump_preflight.py"), "--patches", str(ps_dir),
                           "--pin", str(vllm_pin_root), "--candidate", str(vllm_candidate_root), "-q",
                           "--fail-on", "config"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------- synthetic trees


def _tree(root: Path, version: str, files: dict[str, str]) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "version.py").write_text(f'__version__ = "{version}"\n')
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _patch(d: Path, name: str, text: str) -> None:
    d.mkdir(exist_ok=True)
    (d / f"{name}.toml").write_text(text)


def test_merged_marker_wins_over_replacement_on_pristine_candidate(tmp_path):
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/a.py": "def f():\n    x = 1\n    return x\n"})
    cand = _tree(tmp_path / "cand", "1.1.0", {"vllm/a.py": "def f():\n    x = 2  # upstream fix\n    return x\n"})
    _patch(tmp_path / "p", "B1", """id = "B1"\ntitle = "backport"\n[[files]]\npath = "vllm/a.py"\n[[files.edits]]
name = "fix"\nmerged_markers = ["# upstream fix"]\nanchor = '''\n    x = 1\n'''\nreplacement = '''\n    x = 2  # upstream fix\n'''\n""")
    ps = load_patch_set(tmp_path / "p", packs=False)
    report = run_preflight(ps, pin, cand, config=False)
    e = report.patches[0].edits[0]
    assert (e.pin_verdict, e.verdict) == (Verdict.APPLIES, Verdict.MERGED)
    assert [m.patch for m in report.newly_merged] == ["B1"] and not report.newly_reverted
    assert report.summary.exit_code == 0 and exit_code(report, ["any"]) == 1


def test_marker_present_on_both_trees_is_not_newly_merged(tmp_path):
    text = "def f():\n    x = 2  # upstream fix\n    return x\n"
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/a.py": text})
    cand = _tree(tmp_path / "cand", "1.1.0", {"vllm/a.py": text + "\n"})
    _patch(tmp_path / "p", "B1", """id = "B1"\ntitle = "backport"\n[[files]]\npath = "vllm/a.py"\n[[files.edits]]
name = "fix"\nmerged_markers = ["# upstream fix"]\nanchor = '''\n    x = 1\n'''\nreplacement = '''\n    x = 2  # upstream fix\n'''\n""")
    report = run_preflight(load_patch_set(tmp_path / "p", packs=False), pin, cand, config=False)
    assert not report.newly_merged and not report.newly_reverted
    assert report.retired_upstream[0].detail.startswith("already merged on the pin")


def test_moved_function_found_in_new_module(tmp_path):
    body = "".join(f"    value_{i} = compute_thing_{i}(alpha, beta)\n" for i in range(8))
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/big.py": "import os\n\n\ndef helper(alpha, beta):\n" + body
                                          + "    return value_0\n\n\ndef keep():\n    return 1\n"})
    cand = _tree(tmp_path / "cand", "1.1.0", {"vllm/big.py": "import os\n\n\ndef keep():\n    return 1\n",
                                            "vllm/helpers/new_home.py": "import os\n\n\nclass Box:\n    def helper(self, alpha, beta):\n"
                                            + body.replace("    ", "        ") + "        return value_0\n"})
    _patch(tmp_path / "p", "M1", """id = "M1"\ntitle = "moved"\n[[files]]\npath = "vllm/big.py"\n[[files.edits]]
name = "m"\nanchor = '''\n    value_3 = compute_thing_3(alpha, beta)\n    value_4 = compute_thing_4(alpha, beta)\n'''
replacement = '''\n    value_3 = compute_thing_3(alpha, beta)\n    value_4 = compute_thing_4(alpha, beta)  # m\n'''\n""")
    report = run_preflight(load_patch_set(tmp_path / "p", packs=False), pin, cand, config=False)
    e = report.patches[0].edits[0]
    assert e.verdict == Verdict.DRIFTED
    top = e.suggestions[0]
    assert (top.file, top.line, top.end_line, top.qualname) == ("vllm/helpers/new_home.py", 9, 10, "Box.helper")
    assert "same name (helper)" in top.reasons and top.similarity == 100


def test_bad_tree_spec_is_exit_2(tmp_path, capsys):
    assert sndr_main(["preflight", "--patches", str(DATA / "bump_0100_0101"), "--pin", "vllm>=1", "--candidate", "vllm>=2"]) == 2
    assert "exact version" in capsys.readouterr().err


def test_schema_command(capsys):
    assert sndr_main(["schema", "preflight"]) == 0  # in process through the one entry
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "PreflightReport"
    assert {"pin", "candidate", "patches", "summary"} <= set(schema["required"]) | set(schema["properties"])


def test_patched_pin_is_read_through_its_ledger(tmp_path):
    """An installed vLLM that sndr already patched: the preflight compares upstream to upstream."""
    from sndr.apply import run_apply

    text = "def f():\n    x = 1\n    return x\n"
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/a.py": text})
    cand = _tree(tmp_path / "cand", "1.1.0", {"vllm/a.py": text})
    _patch(tmp_path / "p", "L1", """id = "L1"\ntitle = "local"\n[[files]]\npath = "vllm/a.py"\n[[files.edits]]
name = "x"\nanchor = '''\n    x = 1\n'''\nreplacement = '''\n    x = 1  # local\n'''\n""")
    ps = load_patch_set(tmp_path / "p", packs=False)
    from sndr.tree import open_tree

    pristine_digest = open_tree(pin).digest
    assert run_apply(pin, ps).ok
    assert "# local" in (pin / "vllm" / "a.py").read_text()
    report = run_preflight(ps, pin, cand, config=False)
    assert report.pin.ledger and not report.candidate.ledger
    assert report.pin.tree_digest == pristine_digest  # the ledger's pristine bytes, not the patched ones
    e = report.patches[0].edits[0]
    assert (e.pin_verdict, e.verdict) == (Verdict.APPLIES, Verdict.APPLIES)


_L1 = """id = "L1"\ntitle = "local"\n[[files]]\npath = "vllm/a.py"\n[[files.edits]]
name = "x"\nanchor = '''\n    x = 1\n'''\nreplacement = '''\n    x = 1  # local\n'''\n"""


def test_the_same_tree_as_pin_and_candidate_is_refused_before_planning(tmp_path, capsys):
    """`--candidate` equal to `--pin` (a CI job whose candidate fell back to the pin) ran as a bump: "Bump clear",
    exit 0, every patch "still applies", and not a word that nothing was compared. It is bad input now
    (same_tree, exit 2): by spec, by a byte-identical copy elsewhere, and by a patched pin read through its
    ledger; --json - holds the error document and nothing else."""
    from sndr.apply import run_apply

    text = "def f():\n    x = 1\n    return x\n"
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/a.py": text})
    copy = _tree(tmp_path / "copy", "1.0.0", {"vllm/a.py": text})
    _patch(tmp_path / "p", "L1", _L1)
    args = ["preflight", "--patches", str(tmp_path / "p"), "--no-config"]
    assert sndr_main([*args, "--pin", str(pin), "--candidate", str(pin), "--json", "-"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one document, nothing else on stdout
    assert doc["ok"] is False and doc["exit_code"] == 2 and [p["code"] for p in doc["problems"]] == ["same_tree"]
    assert "are both vLLM 1.0.0 with the same files" in err and "(same_tree)" in err, err
    assert f"apply --dry-run --tree {pin}" in err  # the command that checks a set on one tree
    assert sndr_main([*args, "--pin", str(pin), "--candidate", str(copy), "-q"]) == 2  # same bytes, another path
    assert "(same_tree)" in capsys.readouterr().err
    assert run_apply(pin, load_patch_set(tmp_path / "p", packs=False)).ok  # the pin patched: read through its ledger
    with pytest.raises(SndrError) as exc:
        run_preflight(load_patch_set(tmp_path / "p", packs=False), pin, copy, config=False)
    assert exc.value.problems[0].code == "same_tree" and exc.value.exit_code == 2
    # The wrapper CI runs, exactly as the defect was found: exit 2, nothing on stdout.
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bump_preflight.py"), "--patches",
                           str(tmp_path / "p"), "--pin", str(copy), "--candidate", str(copy)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and "(same_tree)" in proc.stderr, proc


def test_one_version_with_other_files_runs_with_a_warning(tmp_path, capsys):
    """Two builds of one version (a local tree against its release) are a real comparison, but not a bump: it
    runs, and says so on stderr, in --json's warnings (stdout stays one JSON document), in the Markdown and as a
    GitHub ::warning. A real bump has no warning."""
    text = "def f():\n    x = 1\n    return x\n"
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/a.py": text, "vllm/b.py": "B = 1\n"})
    build = _tree(tmp_path / "build", "1.0.0", {"vllm/a.py": text + "# local build\n", "vllm/c.py": "C = 1\n"})
    _patch(tmp_path / "p", "L1", _L1)
    md = tmp_path / "r.md"
    assert sndr_main(["preflight", "--patches", str(tmp_path / "p"), "--no-config", "--pin", str(pin),
                      "--candidate", str(build), "--json", "-", "--markdown", str(md)]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    [w] = doc["warnings"]
    assert w["code"] == "same_version" and w["key"] == "--candidate"
    for words in ("are both vLLM 1.0.0, with other files", "1 file changed (vllm/a.py)",
                  "1 file only on the candidate (vllm/c.py)", "1 file only on the pin (vllm/b.py)", "not a bump"):
        assert words in w["message"], w["message"]
    assert f"sndr: preflight: warning: [--candidate]: {w['message']} (same_version)" in err, err
    assert doc["summary"]["transitions"] == {"applies->applies": 1}  # it ran: the edit was compared
    assert f"- **warning**: {w['message']} (same_version)" in md.read_text()
    report = PreflightReport.model_validate(doc)
    assert github_annotations(report)[0].startswith("::warning title=sndr same_version::the pin (")
    bump = _tree(tmp_path / "bump", "1.1.0", {"vllm/a.py": text})
    assert run_preflight(load_patch_set(tmp_path / "p", packs=False), pin, bump, config=False).warnings == []


# ---------------------------------------------------------------------------- confidence and --via (issue 20)


def test_confidence_class_in_every_output(bump):
    ps, report, _, _ = bump
    edits = _edits(report)
    suggested = [e for e in edits.values() if e.confidence is not None]
    assert suggested and all(s.confidence in ("high", "medium", "low") for e in suggested for s in e.suggestions)
    # Moved verbatim with the same qualname: high. Deleted upstream: nothing reaches medium.
    for key in [("PF03", "shortfall"), ("PF04", "fits"), ("PF15", "total")]:
        assert edits[key].confidence == "high", key
    for key in [("PF10", "mtp"), ("PF11", "partition")]:
        assert edits[key].confidence == "low", key
    md = render_markdown(report, ps)
    assert "| confidence |" in md and "no confident match: the code was likely removed or rewritten" in md.lower()
    assert md.splitlines()[2].startswith("**Bump blocked: ")
    sarif = render_sarif(report)
    props = [r["properties"]["confidence"] for r in sarif["runs"][0]["results"] if "properties" in r]
    assert "high" in props and "low" in props
    gh = "\n".join(github_annotations(report))
    assert "confidence high" in gh and "no confident match" in gh
    data = json.loads(report.model_dump_json())
    assert data["summary"]["confidence"]["high"] >= 3


def test_no_confident_match_whenever_nothing_reaches_medium(bump):
    """Every drifted edit whose best suggestion is low (or that has none) says so, in every output."""
    from rich.console import Console

    from sndr.preflight.render import NO_CONFIDENT, render_terminal

    ps, report, _, _ = bump
    weak = [e for p in report.patches for e in p.edits if e.kind == "text" and e.confidence == "low"]
    assert weak
    md = render_markdown(report, ps).lower()
    assert md.count(NO_CONFIDENT) >= len(weak)
    gh = "\n".join(github_annotations(report))
    for e in weak:
        line = next(x for x in gh.splitlines() if f"/{e.name}:" in x)
        assert NO_CONFIDENT in line, line
    console = Console(record=True, width=300)
    render_terminal(report, console=console)
    listed = {(r.patch, r.name) for r in [*report.genuine_anchor_drift, *report.file_missing]}
    shown = [e for p in report.patches for e in p.edits if e in weak and (p.id, e.name) in listed]
    assert shown and console.export_text().count(NO_CONFIDENT) >= len(shown)


def test_auto_releases_take_the_last_patch_of_each_minor_in_between():
    from sndr.preflight.hops import auto_releases, resolve_via

    # `pip index versions vllm` as of this writing (0.24.0 .. 0.33.0, trimmed).
    published = ["0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0", "0.27.1", "0.27.0", "0.26.0", "0.25.1",
                 "0.25.0", "0.24.0", "0.23.0", "0.28.0rc1"]
    assert auto_releases("0.24.0", "0.32.0", published) == ["0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0",
                                                            "0.30.0", "0.31.0"]
    assert auto_releases("0.32.0", "0.33.0", published) == []
    assert resolve_via(["0.27.1", "0.30.0"], "0.24.0", "0.32.0") == ["vllm==0.27.1", "vllm==0.30.0"]
    from sndr.errors import SndrError

    with pytest.raises(SndrError) as exc:
        resolve_via(["0.30.0", "0.27.1"], "0.24.0", "0.32.0")
    assert exc.value.problems[0].code == "bad_via"


def test_two_stdout_outputs_are_refused(capsys):
    assert sndr_main(["preflight", "--pin", "vllm==0.32.0", "--candidate", "vllm==0.33.0", "--json", "-", "--github"]) == 2
    assert "stdout_conflict" in capsys.readouterr().err


# ---------------------------------------------------------------------------- multi-hop (issue 20)

#: Labelled long-jump cases, 0.24.0 -> 0.32.0: (pin file, first line, lines) of a real 0.24.0 anchor and its
#: true place on 0.32.0, found by difflib alone (both oracles of benchmarks/preflight_stack.label: the anchor
#: followed release by release through 0.25.1 ... 0.31.0, and the direct comparison). Chosen by a rule, not
#: by outcome: every case of the seed-11 calibration stack (benchmarks/calibrate_preflight.py) where the
#: direct and the --via answers differ (three: two where only --via is right, one where only direct is),
#: plus the first six cases of that stack whose file is gone on 0.32.0 (both right).
MULTI_HOP = [
    ("vllm/entrypoints/serve/render/serving.py", 407, 3, ("vllm/entrypoints/scale_out/render/serving.py", 184, 187)),
    ("vllm/entrypoints/serve/render/serving.py", 315, 4, ("vllm/entrypoints/scale_out/render/serving.py", 241, 244)),
    ("vllm/v1/worker/gpu/sample/bad_words.py", 22, 2, ("vllm/v1/worker/gpu/sample/bad_words.py", 30, 30)),
    ("vllm/entrypoints/launcher.py", 26, 3, ("vllm/entrypoints/launchers/launcher.py", 175, 177)),
    ("vllm/model_executor/layers/fla/ops/chunk_delta_h.py", 350, 3,
     ("vllm/third_party/flash_linear_attention/ops/chunk_delta_h.py", 312, 314)),
    ("vllm/entrypoints/chat_utils.py", 1417, 3, ("vllm/renderers/chat_utils.py", 1632, 1634)),
    ("vllm/entrypoints/openai/dp_supervisor.py", 312, 3, ("vllm/entrypoints/launchers/dp_supervisor.py", 312, 313)),
    ("vllm/entrypoints/serve/disagg/serving.py", 425, 2,
     ("vllm/entrypoints/scale_out/token_in_token_out/serving.py", 655, 656)),
    ("vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py", 366, 4,
     ("vllm/model_executor/kernels/linear/mxfp6/emulation.py", 91, 93)),
]
VIA = ["0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0"]


def test_multi_hop_via_is_not_worse_than_direct(tmp_path, vllm_root, capsys):
    from sndr.model import Edit, FileEdits, Patch
    from sndr.tomlwrite import dumps_patch

    pin, cand = vllm_root("0.24.0"), vllm_root("0.32.0")
    via = [str(vllm_root(v)) for v in VIA]
    d = tmp_path / "stack"
    d.mkdir()
    for i, (rel, first, n, _) in enumerate(MULTI_HOP):
        anchor = "".join((pin / rel).read_text(encoding="utf-8").splitlines(keepends=True)[first - 1:first - 1 + n])
        p = Patch(id=f"MH{i:02d}", title="multi-hop case",
                  files=[FileEdits(path=rel, edits=[Edit(name="e", anchor=anchor, replacement=anchor + "# local\n")])])
        (d / f"{p.id}.toml").write_text(dumps_patch(p), encoding="utf-8")
    ps = load_patch_set(d, packs=False)

    def top1(report):
        got = []
        for i, (_, _, _, (rel, lo, hi)) in enumerate(MULTI_HOP):
            e = next(x for p in report.patches if p.id == f"MH{i:02d}" for x in p.edits)
            assert e.verdict.value in ("drifted", "file_missing")
            s = e.suggestions[0] if e.suggestions else None
            got.append(bool(s and s.file == rel and s.line <= hi and lo <= s.end_line))
        return got

    direct = top1(run_preflight(ps, pin, cand, config=False))
    report = run_preflight(ps, pin, cand, config=False, via=via)
    hop = top1(report)
    with capsys.disabled():
        print(f"\nmulti-hop 0.24.0 -> 0.32.0: top-1 direct {sum(direct)}/{len(direct)}, --via {sum(hop)}/{len(hop)}")
    assert sum(hop) >= sum(direct)
    assert any(h and not dr for h, dr in zip(hop, direct))  # --via finds what one comparison misses
    assert report.summary.via == ["0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0"]
    e0 = next(x for p in report.patches if p.id == "MH00" for x in p.edits)
    assert e0.path[0].version == "0.24.0" and e0.path[-1].version == "0.32.0" and len(e0.path) == 9


def test_a_bump_that_gates_a_runtime_patch_alone_is_a_finding(tmp_path, vllm_pin_root, vllm_candidate_root):
    """The new-user review (stop 44): a runtime patch whose range ends before the candidate (PK0003 on 0.33.0)
    was listed nowhere but a note: no edits, ``newly_gated`` empty, "Review (0)" under a headline of "review 1",
    and exit 0 under ``--fail-on any``. Its runtime edits are now gated edits like a text patch's."""
    src = DATA / "bump_032_033" / "PF30-pin-only-runtime-wrapper--range-excludes.toml"
    (tmp_path / src.name).write_bytes(src.read_bytes())
    ps = load_patch_set(tmp_path, packs=False)
    report = run_preflight(ps, vllm_pin_root, vllm_candidate_root, config=False)
    (p,) = report.patches
    assert (p.action, [(e.name, e.pin_verdict, e.verdict) for e in p.edits]) == (
        "review", [("group", Verdict.APPLIES, Verdict.GATED)])
    assert [(r.patch, r.name) for r in report.newly_gated] == [("PF30", "group")]
    assert report.summary.pin_counts == {"applies": 1} and report.summary.findings["any"] == 1
    assert exit_code(report, ["any"]) == 1 and exit_code(report, ["drift"]) == 0
    md = render_markdown(report, ps)
    assert "## Review (1)" in md and "PF30" in md.split("## Review (1)")[1]


@pytest.mark.parametrize("hop", ["0.31.0", "pin", "candidate"])
def test_a_via_tree_is_checked_to_lie_between_as_a_version_is(tmp_path, vllm_pin_root, vllm_candidate_root,
                                                              vllm_root, hop):
    """The new-user review (stop 44): `--via 0.31.0` was refused (bad_via) but the same release as a tree
    (a directory, or `vllm==0.31.0`) was taken, and the report's path went back in time (0.32.0 -> 0.31.0 ->
    0.33.0); the pin or the candidate themselves were taken as hops too."""
    from sndr.errors import SndrError

    src = DATA / "bump_032_033" / "PF03-explain-the-kv-memory-shortfall.toml"  # drifted: asks for suggestions
    (tmp_path / src.name).write_bytes(src.read_bytes())
    ps = load_patch_set(tmp_path, packs=False)
    tree = {"0.31.0": vllm_root("0.31.0"), "pin": vllm_pin_root, "candidate": vllm_candidate_root}[hop]
    with pytest.raises(SndrError) as exc:
        run_preflight(ps, vllm_pin_root, vllm_candidate_root, config=False, via=[str(tree)])
    (p,) = exc.value.problems
    assert p.code == "bad_via" and str(tree) in p.message and "not between 0.32.0 and 0.33.0" in p.message, p
