"""The upstream watchlist: lossless schema, round-trip edits, lint and trigger evaluation.

Most tests run on the real watchlist from the field (tests/fixtures/upstream_watchlist.yaml).
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from sndr.__main__ import main as sndr_main
from sndr.errors import SndrError
from sndr.upstream.triggers import PreflightFacts, check
from sndr.upstream.watchlist import (
    edit_field,
    edit_watchlist,
    find_row,
    json_schema,
    load_watchlist,
    parse_patch_ref,
    parse_watchlist,
    set_field,
)
from sndr.upstream.watchlist_lint import Registry, lint

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upstream_watchlist.yaml"
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "patches" / "watchlist.yaml"


@pytest.fixture(scope="module")
def text() -> str:
    return FIXTURE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def loaded(text):
    return parse_watchlist(text, str(FIXTURE))


def changed_lines(old: str, new: str) -> list[str]:
    return [ln for ln in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


# ----------------------------------------------------------------------------- schema


def test_real_fixture_loads_with_nothing_lost(text, loaded):
    assert len(loaded.model.watch) == 40 and len(loaded.model.sweep) == 73
    independent = YAML(typ="safe", pure=True).load(text)
    assert loaded.model.to_data() == independent
    # types survive: a YAML date stays a date, a quoted date stays a string
    sinces = {type(r["since"]) for r in independent["watch"]}
    assert sinces == {dt.date, str}
    assert [type(r.since) for r in loaded.model.watch] == [type(r["since"]) for r in independent["watch"]]


def test_shipped_watchlist_tracks_the_shipped_patch_set(capsys, monkeypatch):
    """The project's own watchlist lints clean against the shipped registry (`watchlist lint`, in process
    through the one entry)."""
    from sndr.load import load_patch_set

    loaded = load_watchlist(SHIPPED)
    ids = {p.id for p in load_patch_set().patches}
    named = {pid for row in loaded.model.watch + loaded.model.sweep for pid in row.patch_ids()}
    assert named and named <= ids
    monkeypatch.chdir(ROOT)
    rc = sndr_main(["watchlist", "lint"])
    out, err = capsys.readouterr()
    assert rc == 0 and "no findings" in out, out + err


def test_dump_validates_back_to_the_same_data(loaded):
    data = loaded.model.to_data()
    again = type(loaded.model).model_validate(data)
    assert again.to_data() == data
    assert list(data) == ["watch", "sweep", "__sentinel__"]
    # absent optional keys stay absent, so a dump never grows the file
    assert "severity" not in data["watch"][8] and "markers" not in data["sweep"][0]
    assert "__sentinel__" in json_schema()["properties"]


@pytest.mark.parametrize("old,new,key,needle", [
    ("  status: open            # network sweep 2026-07-05 (audit",
     "  status: mergd            # network sweep 2026-07-05 (audit", "status", "'mergd' is not a known value"),
    ("  severity: P2-cleanup\n", "  severity: P9-whatever\n", "severity", "is not a severity"),
    ("  action: watch           # was retire;", "  action: retry           # was retire;", "action", "'retry'"),
    ("  severity: P2-cleanup\n", "  severity: P2-cleanup\n  colour: red\n", "colour", "unknown key 'colour'"),
    ("  local_patches:\n  - G4_04\n", "  local_patches:\n  - 4G_04\n", "local_patches", "local_patches"),
])
def test_unknown_values_and_keys_name_the_row_and_key(text, old, new, key, needle):
    assert text.count(old) >= 1
    bad = text.replace(old, new, 1)
    with pytest.raises(SndrError) as exc:
        parse_watchlist(bad, "w.yaml")
    probs = exc.value.problems
    assert exc.value.exit_code == 2
    assert any(p.key == key and "watch[1] vllm#40886" in p.message and needle in p.message for p in probs), \
        [p.render() for p in probs]
    line = next(p.line for p in probs if p.key == key)
    assert bad.splitlines()[line - 1].lstrip().startswith((key, "- "))


def test_sweep_values_are_checked(text):
    bad = text.replace("- pr: 47609\n", "- pr: '47609'\n").replace("  detection: manual\n", "  detection: eyeball\n", 1)
    with pytest.raises(SndrError) as exc:
        parse_watchlist(bad, "w.yaml")
    msgs = {p.key: p.message for p in exc.value.problems}
    assert "sweep[" in msgs["pr"] and "integer" in msgs["pr"]
    assert "#45207" in msgs["detection"] and "'eyeball'" in msgs["detection"]


def test_sentinel_guards_against_truncation(text):
    assert text.endswith("__sentinel__: complete")  # the field file has no final newline
    with pytest.raises(SndrError) as exc:
        parse_watchlist(text.replace("__sentinel__: complete", ""), "w.yaml")
    assert exc.value.problems[0].code == "truncated_watchlist"
    moved = "__sentinel__: complete\n" + text.replace("__sentinel__: complete", "")
    with pytest.raises(SndrError) as exc:
        parse_watchlist(moved, "w.yaml")
    assert "last key" in exc.value.problems[0].message
    with pytest.raises(SndrError) as exc:
        parse_watchlist(text + "\nextra: 1\n", "w.yaml")
    assert "unknown top-level key 'extra'" in exc.value.render()


def test_yaml_errors_carry_a_line():
    with pytest.raises(SndrError) as exc:
        parse_watchlist("watch:\n- upstream: vllm#1\n  status: [open\n", "w.yaml")
    assert exc.value.problems[0].code == "yaml_syntax" and exc.value.problems[0].line
    # a value YAML parses but its type refuses (the timestamp constructor's ValueError has no mark): still
    # the line (the new-user review of stop 44 got "w5.yaml: malformed YAML: month must be in 1..12")
    bad_date = ("watch:\n- upstream: vllm#1\n  status: open\n  severity: P1-correctness\n  local_patches: [PX0001]\n"
                "  action: watch\n  since: 2026-13-45\n__sentinel__: complete\n")
    with pytest.raises(SndrError) as exc:
        parse_watchlist(bad_date, "w.yaml")
    p = exc.value.problems[0]
    assert (p.code, p.line) == ("yaml_syntax", 7) and "month must be in 1..12" in p.message, p


def test_markers_are_optional_and_validated(loaded):
    after = edit_watchlist(loaded, "#47609", "markers", ["and not isinstance(kv_cache_spec, TQFull"])  # the new text, parsed
    assert after.model.sweep[find_row(after.model, "#47609")[1]].markers == [
        "and not isinstance(kv_cache_spec, TQFull"]


def test_patch_refs():
    assert parse_patch_ref("PN340, PN341").ids == ("PN340", "PN341")
    assert parse_patch_ref("watch-only").kind == "watch-only"
    assert parse_patch_ref("planned: PN371") == parse_patch_ref("planned: PN371")
    assert parse_patch_ref("planned: PN371").ids == ("PN371",)
    assert parse_patch_ref("planned: PN-tbd (loader fail-fast validation)").ids == ()
    assert parse_patch_ref("see the G4 family").kind == "text"


# ----------------------------------------------------------------------------- round-trip editing


def test_set_status_changes_only_that_line(text, loaded):
    after = edit_watchlist(loaded, "vllm#40886", "status", "merged")  # set_field on the module's one parse
    new = after.text
    diff = changed_lines(text, new)
    assert len(diff) == 2, diff
    assert diff[0].startswith("-  status: open ") and diff[1].startswith("+  status: merged ")
    # the comment stays, in its column
    assert diff[0].index("#") == diff[1].index("#")
    assert diff[1].endswith("verified native equivalent in the target pin.")
    row = after.model.watch[1]
    assert row.upstream == "vllm#40886" and row.status == "merged"


def test_cli_set_on_a_copy(tmp_path, text, capsys, monkeypatch):
    import sndr.upstream.watchlist as wmod

    wl = tmp_path / "watchlist.yaml"
    shutil.copy(FIXTURE, wl)
    parses: list[int] = []
    real = wmod.load_rt_nodes
    monkeypatch.setattr(wmod, "load_rt_nodes", lambda text, file: parses.append(len(text)) or real(text, file))
    assert sndr_main(["watchlist", "set", "vllm#40886", "status", "merged", "--watchlist", str(wl)]) == 0
    assert len(changed_lines(text, wl.read_text())) == 2
    # the file parsed once, the result once to check it (set_field parsed the file a second time: ~0.2 s each)
    assert len(parses) == 2, parses
    assert sndr_main(["watchlist", "set", "vllm#40886", "status", "bogus", "--watchlist", str(wl)]) == 2
    assert "'bogus' is not a known value" in capsys.readouterr().err
    assert sndr_main(["watchlist", "set", "vllm#99999", "status", "open", "--watchlist", str(wl)]) == 2
    assert sndr_main(["watchlist", "set", "#47462", "trigger", "retire-on-merge", "--watchlist", str(wl), "--dry-run"]) == 0
    assert "+  trigger: retire-on-merge" in capsys.readouterr().out
    assert len(changed_lines(text, wl.read_text())) == 2  # the dry run wrote nothing


@pytest.mark.parametrize("selector,key,value,n_changed", [
    ("vllm#40886", "local_patches", ["G4_04", "G4_99"], 1),  # one line added to a block list
    ("vllm#43559", "local_patches", ["PN1"], 2),  # flow [] -> flow [PN1]
    ("vllm#40886", "severity", "P1-crash", 2),
    ("vllm#39598", "since", dt.date(2026, 1, 1), 2),
    ("vllm#38864", "since", "2026-06-20", 2),  # a quoted date stays quoted
    ("vllm#43559", "markers", ["foo: bar", "baz"], 3),  # a new key, placed after the row's last key
    ("vllm#40886", "fix_upstream", "vllm#41000", 1),  # a new key, placed after its schema neighbour
    ("#47462", "genesis_patch", "G4_26, PN1", 2),  # keeps the single quotes
    pytest.param("#45207", "detection", "test", 2,  # a plain scalar replaced in place, as severity below
                 marks=pytest.mark.full_only("the severity case and test_set_status_changes_only_that_line")),
    ("#47462", "note", "short note", 9),  # a folded multi-line scalar becomes one line
    ("vllm#39598", "notes", "two\nlines\n", 18),  # a block scalar stays a block scalar
    ("vllm#45466", "notes", "it's: a 'quoted' # note", 8),
])
def test_set_keeps_every_other_line(text, loaded, selector, key, value, n_changed):
    # set_field on the text parsed once per module; `after` is the new text as parsed (the parse that checked
    # it: parsing it again here cost a second 0.2 s ruamel parse per case)
    after = edit_watchlist(loaded, selector, key, value)
    new = after.text
    assert loaded.text == text and loaded.nodes is not None
    assert len(changed_lines(text, new)) == n_changed, changed_lines(text, new)
    section, index = find_row(loaded.model, selector)
    before_data, after_data = loaded.model.to_data(), after.model.to_data()
    assert after_data[section][index][key] == value
    after_data[section][index].pop(key)
    before_data[section][index].pop(key, None)
    assert after_data == before_data


def test_edit_splices_at_the_node_tree_of_the_one_parse(text, loaded):
    """parse_watchlist keeps the node tree its data was built from; it is the tree a fresh compose gives
    (every position an edit splices at), and set_field and edit_field give the same text."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    from sndr.upstream.yamledit import rt_yaml

    def shape(node):
        kids = ([(shape(k), shape(v)) for k, v in node.value] if isinstance(node, MappingNode)
                else [shape(v) for v in node.value] if isinstance(node, SequenceNode) else node.value)
        return (type(node).__name__, str(node.tag), node.start_mark.index, node.end_mark.index,
                getattr(node, "style", None), getattr(node, "flow_style", None), kids)

    assert shape(loaded.nodes) == shape(rt_yaml().compose(text))
    small = "watch:\n- upstream: vllm#1\n  status: open  # why\n  action: watch\nsweep: []\n__sentinel__: complete\n"
    assert edit_field(parse_watchlist(small), "vllm#1", "status", "merged") == set_field(small, "vllm#1", "status",
                                                                                         "merged")


def test_set_on_a_row_with_a_merge_key_composes_the_text_again():
    """ruamel's constructor deletes merge keys (``<<``) from the nodes it builds from; such a text is
    composed afresh for the edit, and the edit still changes only its line."""
    wl = ("watch:\n- &base\n  upstream: vllm#1\n  status: open\n  action: watch\n"
          "- <<: *base\n  upstream: vllm#2\n  status: open   # merged row\n"
          "sweep: []\n__sentinel__: complete\n")
    loaded = parse_watchlist(wl)
    assert loaded.nodes is None and loaded.model.watch[1].action == "watch"
    new = edit_field(loaded, "vllm#2", "status", "merged")
    assert changed_lines(wl, new) == ["-  status: open   # merged row", "+  status: merged # merged row"]
    assert parse_watchlist(new).model.watch[1].status == "merged"


def test_set_refuses_duplicates_and_unknown_keys(text):
    dup = text.replace("- upstream: vllm#39598\n", "- upstream: vllm#40886\n", 1)
    with pytest.raises(SndrError) as exc:
        set_field(dup, "vllm#40886", "status", "merged")
    assert exc.value.problems[0].code == "ambiguous_row"
    with pytest.raises(SndrError) as exc:
        set_field(text, "vllm#40886", "trigger", "retire-on-merge")
    assert exc.value.problems[0].code == "unknown_key"


# ----------------------------------------------------------------------------- lint

#: What lint finds on the real watchlist without a patch set (structure only).
REAL_CONTRADICTIONS = [
    ("watch[2] vllm#43409", "merged in the pin"),
    ("watch[14] vllm#43887", "closed unmerged"),
    ("watch[15] vllm#43878", "closed unmerged"),
    ("watch[18] vllm#42006", "can never fire"),
    ("watch[19] vllm#42237", "can never fire"),
    ("watch[20] vllm#43074", "can never fire"),
    ("watch[32] vllm#40265", "closed unmerged"),
]


def test_lint_real_fixture_structure(loaded):
    found = lint(loaded, None)
    assert [p.code for p in found] == ["action_contradicts_status"] * len(REAL_CONTRADICTIONS)
    for p, (row, why) in zip(found, REAL_CONTRADICTIONS):
        assert p.message.startswith(row + ":") and why in p.message and p.key == "action" and p.line


def test_lint_real_fixture_against_a_registry(loaded):
    ids = {pid for r in loaded.model.watch for pid in r.local_patches}
    ids |= {pid for r in loaded.model.sweep for pid in r.patch_ids()}
    lifecycles = {pid: "active" for pid in ids}
    lifecycles.update({"G4_26": "retired", "PN370": "retired", "PN371": "active"})
    del lifecycles["P62"]
    found = lint(loaded, Registry(lifecycles))
    codes = {}
    for p in found:
        codes.setdefault(p.code, []).append(p)
    assert {p.patch for p in codes["retired_patch"]} == {"G4_26", "PN370"}
    assert all(p.message.startswith("sweep[") for p in codes["retired_patch"])
    assert {p.patch for p in codes["unknown_patch"]} == {"P62"}
    assert len(codes["unknown_patch"]) == 4  # one watch row, three sweep rows
    assert [p.patch for p in codes["planned_patch_exists"]] == ["PN371"]


def test_lint_duplicates_and_sweep_contradictions(text):
    extra_watch = ("- upstream: vllm#45466\n  status: merged\n  local_patches:\n  - P67\n  action: watch\n"
                   "  since: '2026-06-19'\n")
    extra_sweep = ("- pr: 46446\n  genesis_patch: PN999\n  trigger: reanchor-on-merge\n"
                   "- pr: 99999\n  genesis_patch: watch-only\n  trigger: retire-on-merge\n")
    dup = text.replace("sweep:\n- pr: 46384\n", extra_watch + "sweep:\n" + extra_sweep + "- pr: 46384\n")
    loaded = parse_watchlist(dup, "w.yaml")
    found = lint(loaded, None)
    dups = [p for p in found if p.code == "duplicate_row"]
    assert [p.message.split(":")[0] for p in dups] == ["watch[40] vllm#45466", "sweep[3] #46446"]
    assert "disagree" in dups[0].message
    contra = [p for p in found if p.code == "action_contradicts_status" and p.message.startswith("sweep")]
    assert "watch-only" in contra[0].message
    twin = [p.message for p in found if p.code == "twin_rows_disagree"]
    assert len(twin) == 2 and all(m.startswith("sweep[0] #46446") for m in twin)
    assert any("action 'retire'" in m for m in twin) and any("names PN999" in m for m in twin)


def test_cli_lint_real_fixture(tmp_path, capsys):
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PN129.toml").write_text(
        'id = "PN129"\ntitle = "t"\nlifecycle = "retired"\n\n[[files]]\npath = "vllm/x.py"\n\n'
        "[[files.edits]]\nname = \"e\"\nanchor = '''\na\n'''\nreplacement = '''\nb\n'''\n")
    rc = sndr_main(["watchlist", "lint", "--watchlist", str(FIXTURE), "--patches", str(pdir), "--json", "-"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    codes = [f["code"] for f in out["findings"]]
    assert codes.count("retired_patch") == 1 and codes.count("action_contradicts_status") == 7
    assert "unknown_patch" in codes
    assert sndr_main(["watchlist", "lint", "--watchlist", str(FIXTURE), "--no-registry"]) == 1
    assert "7 action_contradicts_status" in capsys.readouterr().out


# ----------------------------------------------------------------------------- trigger evaluation


def _preflight(**lists) -> dict:
    base = {"pin": {"version": "0.32.0"}, "candidate": {"version": "0.33.0"}, "patches": [], "summary": {},
            "genuine_anchor_drift": [], "retired_upstream": [], "newly_merged": [], "newly_reverted": []}
    base.update(lists)
    return base


def test_check_fires_each_trigger(loaded):
    # the marked text, parsed once (edit_watchlist: the parse that checked the edit)
    loaded = edit_watchlist(loaded, "#47609", "markers", ["and not isinstance(kv_cache_spec, TQFullAttentionSpec)"])
    pre = _preflight(
        patches=[
            {"id": "PN129", "status": "merged", "edits": [{"file": "f", "name": "e", "verdict": "merged",
                                                           "pin_verdict": "applies"}]},
            {"id": "PN346B", "status": "failed", "edits": [{"file": "f", "name": "clamp", "verdict": "drifted",
                                                            "pin_verdict": "applies"}]},
            {"id": "PN346", "status": "applies", "edits": [{"file": "f", "name": "e", "verdict": "applies",
                                                            "pin_verdict": "applies"}]},
        ],
        genuine_anchor_drift=[{"patch": "PN346B", "file": "f", "name": "clamp"}],
        newly_merged=[{"patch": "PN520", "file": "vllm/v1/worker/gpu/attn_utils.py", "scope": "edit",
                       "marker": "and not isinstance(kv_cache_spec, TQFullAttentionSpec)", "extra": 1}],
    )
    rep = check(loaded, PreflightFacts.from_json(pre), "pre.json")
    fired = {(f.section, f.row, f.trigger): f for f in rep.fired}
    # retire-on-merge: the watch row (action retire) and the sweep row for #46446 are one trigger,
    # reported once and naming both rows (issue 17, defect 7)
    f = fired[("watch", "vllm#46446", "retire-on-merge")]
    assert f.patches == ["PN129"] and f.rows == ["watch vllm#46446", "sweep #46446"]
    assert ("sweep", "#46446", "retire-on-merge") not in fired
    # reanchor-on-merge: #46384 lists PN346 and PN346B; only PN346B drifted. #47491 names PN346B.
    f = fired[("watch", "vllm#46384", "reanchor-on-merge")]
    assert f.patches == ["PN346B"] and f.rows == ["watch vllm#46384", "sweep #46384"]
    assert fired[("sweep", "#47491", "reanchor-on-merge")].patches == ["PN346B"]
    # review-on-merge: the marker of #47609 is newly merged
    f = fired[("sweep", "#47609", "review-on-merge")]
    assert f.markers == ["and not isinstance(kv_cache_spec, TQFullAttentionSpec)"] and "attn_utils.py" in f.reason
    assert sorted(fired) == [("sweep", "#47491", "reanchor-on-merge"), ("sweep", "#47609", "review-on-merge"),
                             ("watch", "vllm#46384", "reanchor-on-merge"), ("watch", "vllm#46446", "retire-on-merge")]


def test_check_nothing_fires_on_a_quiet_candidate(loaded):
    assert check(loaded, PreflightFacts.from_json(_preflight())).fired == []


def test_check_rejects_what_is_not_a_preflight():
    with pytest.raises(SndrError):
        PreflightFacts.from_json({"hello": 1})
    with pytest.raises(SndrError):
        PreflightFacts.from_json({"patches": [{"edits": []}]})
    with pytest.raises(SndrError):
        PreflightFacts.from_json([])


def test_cli_check(tmp_path, capsys):
    pre = tmp_path / "pre.json"
    pre.write_text(json.dumps(_preflight(retired_upstream=[{"patch": "PN129", "file": "f", "name": "e"}])))
    assert sndr_main(["watchlist", "check", "--preflight", str(pre), "--watchlist", str(FIXTURE)]) == 1
    out = capsys.readouterr().out
    # one line per fired trigger, naming both rows (issue 17, defect 7)
    lines = [ln for ln in out.splitlines() if "retire-on-merge fired" in ln]
    assert len(lines) == 1, out
    assert "watch vllm#46446 + sweep #46446 (line " in lines[0]
    assert out.count("fired:") == int(out.strip().splitlines()[-1].split()[0])
    pre.write_text(json.dumps(_preflight()))
    assert sndr_main(["watchlist", "check", "--preflight", str(pre), "--watchlist", str(FIXTURE), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["fired"] == []
    pre.write_text("{not json")
    assert sndr_main(["watchlist", "check", "--preflight", str(pre), "--watchlist", str(FIXTURE)]) == 2


def test_check_on_a_real_preflight_report(tmp_path, vllm_pin_root, vllm_candidate_root):
    """End to end with the preflight module: a watchlist over the bump_032_033 patch set."""
    preflight = pytest.importorskip("sndr.preflight.analysis")
    from sndr.load import load_patch_set

    patches = Path(__file__).resolve().parents[1] / "data" / "preflight" / "bump_032_033"
    if not patches.is_dir():
        pytest.skip("preflight data set not available")
    rep = preflight.run_preflight(load_patch_set(patches), str(vllm_pin_root), str(vllm_candidate_root))
    data = json.loads(rep.model_dump_json())
    wl = ("watch:\n"
          "- upstream: vllm#1\n  status: merged\n  local_patches: [PF12, PF01]\n  action: retire\n"
          "- upstream: vllm#2\n  status: open\n  local_patches: [PF09]\n  action: drift-check\n"
          "sweep:\n"
          "- pr: 3\n  genesis_patch: watch-only\n  trigger: review-on-merge\n  markers: ['trim_null_head(']\n"
          "- pr: 4\n  genesis_patch: PF01\n  trigger: retire-on-merge\n"
          "__sentinel__: complete\n")
    out = check(parse_watchlist(wl), PreflightFacts.from_json(data))
    fired = {(f.row, f.trigger): f.patches or f.markers for f in out.fired}
    assert fired == {("vllm#1", "retire-on-merge"): ["PF12"], ("vllm#2", "reanchor-on-merge"): ["PF09"],
                     ("#3", "review-on-merge"): ["trim_null_head("]}


@pytest.mark.parametrize("before", [True, False])
def test_watchlist_option_counts_before_and_after_the_subcommand(before, capsys):
    """`watchlist --watchlist X lint` and `watchlist lint --watchlist X` read X (the subcommand's default of
    None overwrote an option given before it, and the default watchlist was linted instead)."""
    where = ["--watchlist", str(FIXTURE)]
    argv = ["watchlist", *where, "lint", "--no-registry"] if before else ["watchlist", "lint", *where, "--no-registry"]
    sndr_main(argv)
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(f"{FIXTURE}: "), out[-300:]

