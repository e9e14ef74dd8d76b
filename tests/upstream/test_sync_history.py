"""Issue 17: the sync queue on vLLM's history shapes, one scripted git history per defect.

Each test builds a real git repository (real vLLM 0.32.0 files, scripted commits
in vLLM's squash-merge form) that reproduces the defect as it was found, and
checks the fixed behaviour. The release-branch test at the end runs the CLI
exactly as the README's pin-bump walk-through does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.errors import SndrError
from sndr.pinrecord import read_pin
from sndr.upstream.decisions import EMPTY, load_decisions, parse_decisions, set_deviation
from sndr.upstream.diff import parse_hunks
from sndr.upstream.judge import classify_hunk
from sndr.upstream.pin import gate_benchmark, gate_deviations, gate_queue
from sndr.upstream.reverts import revert_target_subject, strip_pr
from sndr.upstream.sync import Surface, plan_queue, render_markdown
from upstream.test_sync import (  # noqa: F401, F811 - scripted and source are fixtures
    BENCH,
    BLOCK_POOL,
    COORD,
    DEBUG_DUMP_NEW,
    DEBUG_DUMP_OLD,
    GOOD_PREFLIGHT,
    LOCAL_NEW_BLOCKS,
    METRICS,
    NEW_BLOCKS_MSG,
    NO_PREFIX,
    PROBE_NEW,
    PROBE_OLD,
    STM,
    SURFACE,
    TOUCH_COMMENT,
    TOUCH_INCREMENT,
    USAGE,
    Repo,
    _dir_tree,
    _write_patch,
    make_tree,
    scripted,
    source,
    tree_edit,
)


def _git(repo: Repo, *args: str) -> str:
    return repo.git(*args)


# ----------------------------------------------------------------------------- 1. release branches


@pytest.fixture
def releases(tmp_path, source):
    """main with a fix that is cherry-picked onto releases/v0.32 (tag v0.32.0), and releases/v0.33 cut
    later with a cherry-pick of a main commit made after the cut (tag v0.33.0)."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD, METRICS])
    c = {"base": repo.base}
    c["fix"] = repo.edit(*USAGE, "[Bugfix] Return a float usage (#51001)")
    c["main2"] = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#51002)")
    repo.git("checkout", "-q", "-b", "releases/v0.32", "pin")
    repo.git("cherry-pick", "-x", c["fix"])
    c["fix_pick"] = repo.git("rev-parse", "HEAD")
    repo.git("tag", "v0.32.0")
    repo.git("checkout", "-q", "main")
    c["main3"] = repo.edit(*TOUCH_COMMENT, "[Misc] Clarify touch() comment (#51003)")
    repo.git("branch", "releases/v0.33")
    c["late"] = repo.edit(*TOUCH_INCREMENT, "[Bugfix] Spell out the increment (#51004)")
    repo.git("checkout", "-q", "releases/v0.33")
    repo.git("cherry-pick", "-x", c["late"])
    c["late_pick"] = repo.git("rev-parse", "HEAD")
    repo.git("tag", "v0.33.0")
    repo.git("checkout", "-q", "main")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD, METRICS])
    tree_edit(tree, *USAGE)  # the tree is v0.32.0: it carries the cherry-picked fix
    return repo, tree, c


def test_release_tags_that_are_not_ancestors_plan_as_git_log_from_to(releases):
    repo, tree, c = releases
    ok = subprocess.run(["git", "-C", str(repo.path), "merge-base", "--is-ancestor", "v0.32.0", "v0.33.0"])
    assert ok.returncode == 1  # the defect's shape: the old planner refused this range (not_ancestor)
    rep = plan_queue(repo.path, "v0.32.0", "v0.33.0", SURFACE, _dir_tree(tree))
    assert rep.merge_base == c["base"] and rep.from_is_ancestor is False
    assert rep.pin_side == [c["fix_pick"]]
    # git log v0.32.0..v0.33.0: main since the merge-base, then the release branch's own commit
    assert [e.sha for e in rep.commits] == [c["fix"], c["main2"], c["main3"], c["late_pick"]]
    fix = rep.entry(c["fix"])
    assert (fix.disposition, fix.status, fix.cherry_pick_of) == ("satisfied", "skip", c["fix_pick"])
    assert f"cherry-picked onto the pin's side as {c['fix_pick'][:10]} (same patch-id)" == fix.reason
    assert rep.counts["cherry_picked"] == 1
    assert [w.commits for w in rep.waves] == [[c["main2"], c["main3"]], [c["late_pick"]]]
    md = render_markdown(rep)
    assert f"merge-base `{c['base'][:10]}`" in md and "not an ancestor of --to (release branches)" in md


def test_plan_json_on_stdout_is_the_only_stdout(releases, capsys):
    repo, tree, c = releases
    pdir = tree.parent / "patches"
    pdir.mkdir()
    rc = sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree", str(tree),
                   "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-"])
    out = capsys.readouterr()
    assert rc == 1
    data = json.loads(out.out)  # nothing but the JSON document
    assert data["merge_base"] == c["base"] and data["counts"]["cherry_picked"] == 1
    assert f"merge-base {c['base'][:10]}" in out.err and "3 queued" in out.err
    # --md - as well: one stdout cannot hold both; refused before any work (the Markdown was silently dropped)
    rc = sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                    str(tree), "--patches", str(pdir), "--json", "-", "--md", "-"])
    out = capsys.readouterr()
    assert rc == 2 and json.loads(out.out)["problems"][0]["code"] == "stdout_conflict", out


def test_backwards_range_is_refused(releases):
    repo, tree, c = releases
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "main", "pin", SURFACE, _dir_tree(tree))
    assert exc.value.problems[0].code == "backwards_range"


# ----------------------------------------------------------------------------- 2. reverts


def _inverse(repo: Repo, rel: str, old: str, new: str, message: str, body: str = "") -> str:
    p = repo.path / rel
    text = p.read_text()
    assert text.count(new) == 1
    p.write_text(text.replace(new, old))
    repo.git("add", "-A")
    args = ["commit", "-q", "-m", message] + (["-m", body] if body else [])
    repo.git(*args)
    return repo.git("rev-parse", "HEAD")


def test_revert_subject_parsing_in_squash_form():
    subj = 'Revert "[Bugfix] Foo (#51234)" (#51300)'
    assert revert_target_subject(subj) == "[Bugfix] Foo (#51234)"
    assert strip_pr("[Bugfix] Foo (#51234)") == "[Bugfix] Foo"
    chain = 'Revert "Revert "[Bugfix] Foo (#51234)" (#51300)" (#51301)'
    assert revert_target_subject(chain) == 'Revert "[Bugfix] Foo (#51234)" (#51300)'
    assert strip_pr(revert_target_subject(chain)) == strip_pr(subj)
    assert revert_target_subject("[Bugfix] Revert to the old path (#5)") is None


def test_reverts_pair_by_subject_body_and_patch_id_and_chains_net_out(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    p = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#50000)")
    repo.git("tag", "-f", "pin")  # p is the pin's: its revert below is a revert of a commit outside the range
    a = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "[Bugfix] Add BlockPool.debug_dump (#51234)")
    ra = _inverse(repo, BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW,
                  'Revert "[Bugfix] Add BlockPool.debug_dump (#51234)" (#51300)')
    b = repo.edit(*TOUCH_COMMENT, "[Misc] Clarify touch() comment (#51301)")
    rb = _inverse(repo, *TOUCH_COMMENT, "[Misc] Back out the comment (#51302)", f"This reverts commit {b}.")
    cc = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "[Core] Add a manager probe (#51303)")
    rc = _inverse(repo, COORD, PROBE_OLD, PROBE_NEW, "[Core] Simplify the coordinator (#51304)")  # silent
    rp = _inverse(repo, *NO_PREFIX, 'Revert "[Core] Explain the no-prefix return (#50000)" (#51305)')
    d = repo.edit(*USAGE, "[Perf] Float usage (#51306)")
    rd = _inverse(repo, *USAGE, 'Revert "[Perf] Float usage (#51306)" (#51307)')
    rrd = repo.edit(*USAGE, 'Revert "Revert "[Perf] Float usage (#51306)" (#51307)" (#51308)')
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    tree_edit(tree, *NO_PREFIX)  # the tree is the pin
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    e = {k: rep.entry(v) for k, v in dict(a=a, ra=ra, b=b, rb=rb, c=cc, rc=rc, rp=rp, d=d, rd=rd, rrd=rrd).items()}
    for x, y, how in (("a", "ra", "subject"), ("b", "rb", "body"), ("c", "rc", "patch-id")):
        assert e[x].status == e[y].status == "cancelled", (x, e[x].reason, e[y].reason)
        assert e[x].pair == e[y].sha and e[y].reverts == e[x].sha
        assert f"reverts {e[x].sha[:10]} (paired by {how})" in e[y].flags
    # a revert of a commit before the range is reported as such, and is real work
    assert e["rp"].reverts == p and f"reverts {p[:10]} (outside the range)" in e["rp"].flags
    assert e["rp"].status == "port"
    # a chain of three: d stands, its revert and the revert of the revert cancel
    assert e["d"].status == "port" and "revert chain of 3 nets out to this commit standing" in e["d"].flags
    assert e["rd"].status == e["rrd"].status == "cancelled"
    assert "nets out to" in e["rd"].reason
    # the revert of the revert re-lands d: said as a re-land, counted apart from the reverts
    assert e["rrd"].relands == d and e["rrd"].reverts is None
    assert f"re-lands {d[:10]} after its revert {rd[:10]} (paired by subject)" in e["rrd"].flags
    assert rep.counts["reverts_paired"] == 4 and rep.counts["relands"] == 1 and rep.counts["reverts_outside"] == 1


#: (how the change lands again after `Revert "X (#51234)" (#51300)`, its subject, whether it carries X's diff
#: exactly, its body, how it is found). vLLM re-lands a reverted PR as a new PR with the same title, or as
#: `Reapply "X (#N)"` (git's own subject for a revert of a revert since 2.43, with `This reverts commit`), or
#: with GitHub's revert button on the revert.
RELAND_TITLE = "[Bugfix] Add BlockPool.debug_dump"
RELANDS = {
    "title again": (f"{RELAND_TITLE} (#51400)", True, "", "paired by patch-id"),
    "Reapply": (f'Reapply "{RELAND_TITLE} (#51234)" (#51400)', True, "", "paired by patch-id"),
    "git revert of the revert": (f'Reapply "{RELAND_TITLE} (#51234)" (#51400)', True, "This reverts commit {rx}.",
                                 "paired by body"),
    "revert button on the revert": (f'Revert "Revert "{RELAND_TITLE} (#51234)" (#51300)" (#51400)', True, "",
                                    "paired by subject"),
    "title again, fixed": (f"{RELAND_TITLE} (#51400)", False, "", "same title and files"),
    "Reapply, fixed": (f'Reapply "{RELAND_TITLE} (#51234)" (#51400)', False, "", "same title and files"),
}


@pytest.mark.parametrize("form", list(RELANDS))
def test_a_change_landed_again_after_its_revert_is_a_re_land_not_a_revert(tmp_path, source, form):
    """X (#51234), `Revert "X (#51234)" (#51300)`, then X again: the third commit was flagged "reverts <the
    revert> (paired by ...)", its `reverts` set, its reason "revert pair ...", and it was counted in
    reverts_paired; X itself was flagged "net-zero lines ... removed again by" the revert its re-land cancels.
    It is a re-land: said so in its flags, reason and `relands`, counted apart. One with a diff of its own (a
    fixed re-land) pairs with nothing and is queued as any commit, flagged as the re-land it is."""
    subject, exact, body, how = RELANDS[form]
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    x = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, f"{RELAND_TITLE} (#51234)")
    rx = _inverse(repo, BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, f'Revert "{RELAND_TITLE} (#51234)" (#51300)')
    new = DEBUG_DUMP_NEW if exact else DEBUG_DUMP_NEW.replace('"total": self.num_gpu_blocks}',
                                                            '"total": self.num_gpu_blocks, "used": 0}')
    (repo.path / BLOCK_POOL).write_text((repo.path / BLOCK_POOL).read_text().replace(DEBUG_DUMP_OLD, new))
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", subject, *(["-m", body.format(rx=rx)] if body else []))
    again = repo.git("rev-parse", "HEAD")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    ex, erx, e = rep.entry(x), rep.entry(rx), rep.entry(again)
    assert not any(f.startswith("reverts ") for f in e.flags), e.flags
    assert f"re-lands {x[:10]} after its revert {rx[:10]} ({how})" in e.flags, e.flags
    assert e.relands == x and e.reverts is None
    assert erx.reverts == x and f"reverts {x[:10]} (paired by subject)" in erx.flags  # the revert stays a revert
    assert rep.counts["reverts_paired"] == 1 and rep.counts["relands"] == 1
    assert not any(f.startswith("net-zero lines") for f in ex.flags), ex.flags
    if exact:  # the revert and its re-land cancel; X stands and is the one ported
        assert (ex.status, erx.status, e.status) == ("port", "cancelled", "cancelled")
        assert erx.pair == again and e.pair == rx
        for entry in (erx, e):
            assert entry.reason.startswith("revert and re-land pair with ")
            assert f"{again[:10]} re-lands {x[:10]} over its revert {rx[:10]} inside the range" in entry.reason
            assert f"nets out to {x[:10]} standing" in entry.reason
        assert [w.commits for w in rep.waves] == [[x]]
    else:  # X and its revert cancel; the fixed re-land is the change to port
        assert (ex.status, erx.status, e.status) == ("cancelled", "cancelled", "port") and e.pair is None
        assert ex.reason == f"revert pair with {rx[:10]} inside the range: they cancel out"
        assert [w.commits for w in rep.waves] == [[again]]
    md = render_markdown(rep)
    assert f"re-lands {x[:10]}" in md and f"reverts {rx[:10]}" not in md
    assert json.loads(rep.model_dump_json())["commits"][2]["relands"] == x


def test_a_reused_title_on_other_files_is_no_re_land(tmp_path, source):
    """`[Misc] Fix typo`-style titles recur: a commit with the title of a reverted commit that touches none of its
    files is judged as any commit and said to carry the title, not called its re-land; the same title on the same
    file is a re-land ('same title and files')."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    x = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, f"{RELAND_TITLE} (#51234)")
    rx = _inverse(repo, BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, f'Revert "{RELAND_TITLE} (#51234)" (#51300)')
    first = (repo.path / COORD).read_text().splitlines(keepends=True)[0]
    other = repo.edit(COORD, first, first + "# coordinator: local note\n", f"{RELAND_TITLE} (#51500)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    e = rep.entry(other)
    assert e.relands is None and e.reverts is None and not any(f.startswith("re-lands") for f in e.flags)
    assert (f"carries the title of {x[:10]}, reverted before it, but touches none of its files: not treated as its "
            "re-land") in e.flags, e.flags
    assert rep.counts["relands"] == 0 and rep.counts["reverts_paired"] == 1
    assert (rep.entry(x).status, rep.entry(rx).status, e.status) == ("cancelled", "cancelled", "port")


# ----------------------------------------------------------------------------- 3. pure additions


LOCAL_DEBUG_DUMP = '''    def debug_dump(self) -> dict[str, int]:
        """Local variant: also counts cached blocks."""
        return {"free": self.get_num_free_blocks(), "cached": len(self.cached_block_hash_to_block)}

    def get_usage(self) -> float:
'''


def test_addition_already_present_in_another_form_is_review(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    add = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "[Misc] Add BlockPool.debug_dump (#52001)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    assert rep.entry(add).disposition == "applicable"  # the plain tree: porting it is right
    tree_edit(tree, BLOCK_POOL, "    def get_usage(self) -> float:\n", LOCAL_DEBUG_DUMP)
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    e = rep.entry(add)
    assert (e.disposition, e.status) == ("review", "port-by-hand")
    line = (tree / BLOCK_POOL).read_text().splitlines().index("    def debug_dump(self) -> dict[str, int]:") + 1
    assert f"review: already present in another form: BlockPool.debug_dump is defined at line {line}" in e.reason
    assert rep.counts["review"] == 1 and rep.waves[0].commits == [add]


def test_addition_with_generic_context_is_not_applicable():
    text = ("class Op:\n    def forward_cuda(self, x):\n        y = self.kernel(\n            x,\n        )\n"
            "        return self\n\n")
    diff = ("@@ -4,3 +4,6 @@\n             x,\n         )\n         return self\n"
            "+\n+    def forward_xpu(self, x):\n+        return x\n")
    res, new = classify_hunk(text, parse_hunks(diff)[0][0])
    assert res.disposition == "review" and new is None
    assert "context is too generic to place it (0 distinctive context line(s))" in res.reason
    # the same block already defined in another form
    twin = text + "    def forward_xpu(self, x, *, fast=True):\n        return x\n"
    res, _ = classify_hunk(twin, parse_hunks(diff)[0][0])
    assert res.disposition == "review" and "forward_xpu is defined at line 8" in res.reason
    # with distinctive context the addition is applicable
    diff2 = ("@@ -1,3 +1,4 @@\n class Op:\n     def forward_cuda(self, x):\n         y = self.kernel(\n"
             "+        z = self.prepare(x)\n")
    res, new = classify_hunk(text, parse_hunks(diff2)[0][0])
    assert res.disposition == "applicable" and "z = self.prepare(x)" in new


# ----------------------------------------------------------------------------- 4. conflicts gate; kept decisions


def _pre(tmp_path: Path) -> Path:
    pre = tmp_path / "pre.json"
    pre.write_text(json.dumps(GOOD_PREFLIGHT))
    os.utime(pre, (1_000_000, 1_000_000))
    return pre


def test_conflict_blocks_pin_advance_until_a_decision_is_recorded(scripted, tmp_path, capsys):
    repo, tree, c = scripted
    for edit in (TOUCH_COMMENT, TOUCH_INCREMENT, NO_PREFIX):
        tree_edit(tree, *edit)
    (tree / "vllm/v1/core/single_type_kv_cache_manager.py").rename(tree / "vllm/v1/core/single_type_manager.py")
    tree_edit(tree, "vllm/v1/core/single_type_manager.py",
              '        """Drain and return block IDs allocated since the last call."""\n',
              '        """Drain and return the block IDs allocated since the last call."""\n')
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    assert [e.sha for e in rep.queued()] == [c["conflict"]]  # everything mechanical is ported
    rep.to_ref = "v0.33.0"
    q = tmp_path / "queue.json"
    q.write_text(rep.model_dump_json())
    empty = load_decisions(tmp_path / "none.yaml").model
    g = gate_queue(rep, "0.33.0", empty)
    assert not g.ok and "1 queued commit(s) without a decision (1 conflict:" in g.reason and c["conflict"][:10] in g.reason
    dfile = tmp_path / "sync-decisions.yaml"
    assert sndr_main(["sync", "decide", c["conflict"][:10], "--queue", str(q), "--tier", "INVENTORY", "--decisions",
                     str(dfile)]) == 0
    assert not gate_queue(rep, "0.33.0", load_decisions(dfile).model).ok  # a tier alone decides nothing
    assert sndr_main(["sync", "decide", c["conflict"][:10], "--resolution", "deferred", "--note", "after 0.33",
                     "--decisions", str(dfile)]) == 0
    d = load_decisions(dfile).model.decisions
    assert [(x.sha, x.subject, x.tier, x.resolution, x.note) for x in d] == [
        (c["conflict"], "Say how many blocks are free", "INVENTORY", "deferred", "after 0.33")]
    assert gate_queue(rep, "0.33.0", load_decisions(dfile).model).ok
    capsys.readouterr()
    rc = sndr_main(["pin", "advance", "--to", "0.33.0", "--preflight", str(_pre(tmp_path)), "--queue", str(q),
                   "--manifest", str(_manifest(tmp_path)), "--patches", str(_empty(tmp_path)),
                   "--decisions", str(dfile), "--no-benchmark-ref", "CPU-only bump", "--pin-file",
                   str(tmp_path / "_pin.toml")])
    assert rc == 0, capsys.readouterr()
    assert "gate queue: pass: every queued commit decided (1: 1 deferred)" in capsys.readouterr().out
    assert read_pin(tmp_path / "_pin.toml").benchmark_waived == "CPU-only bump"


def _manifest(tmp_path: Path) -> Path:
    m = tmp_path / "vllm-0.33.0.json"
    m.write_text(json.dumps({"vllm_version": "0.33.0", "patches": []}))
    return m


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty_patches"
    d.mkdir(exist_ok=True)
    return d


def test_decisions_are_kept_across_replans_and_shown_apart(scripted, tmp_path):
    repo, tree, c = scripted
    dfile = tmp_path / "sync-decisions.yaml"
    dfile.write_text(EMPTY.replace("decisions: []", "# reviewed in the 0.33 bump meeting\ndecisions: []"))
    assert sndr_main(["sync", "decide", c["series1"], "--tier", "PORT-NOW", "--resolution", "ported-as PN0099",
                     "--decisions", str(dfile), "--allow-unknown"]) == 0  # the port is not written yet
    assert sndr_main(["sync", "decide", c["conflict"], "--tier", "IGNORE", "--resolution",
                     "not-needed the local message wins", "--decisions", str(dfile)]) == 0
    before = dfile.read_text()
    assert "# reviewed in the 0.33 bump meeting" in before
    for _ in range(2):  # re-plan: the decisions stay attached, the file is not rewritten
        rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree), decisions=load_decisions(dfile).model)
        assert rep.entry(c["series1"]).decision.resolution == "ported-as PN0099"
        assert rep.entry(c["conflict"]).decision.tier == "IGNORE"
        assert rep.counts["decided"] == 2 and rep.counts["undecided"] == rep.counts["queued"] - 2
        assert dfile.read_text() == before
    md = render_markdown(rep)
    undecided, decided = md.split("# Decided")[0], md.split("# Decided")[1].split("## Not queued")[0]
    assert c["series1"][:10] in decided and c["conflict"][:10] in decided
    assert f"`{c['series1'][:10]}`" not in undecided and f"`{c['series2'][:10]}`" in undecided
    assert "ported-as PN0099" in decided
    # a bad resolution is refused with the accepted forms, and the file is left alone
    assert sndr_main(["sync", "decide", c["series2"], "--resolution", "later", "--decisions", str(dfile)]) == 2
    assert dfile.read_text() == before


# ----------------------------------------------------------------------------- 5. renames into the surface


def test_rename_into_the_surface_brings_earlier_commits_with_it(tmp_path, source):
    new = "vllm/v1/core/metrics/kv_cache_metrics.py"
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, METRICS])
    c1 = repo.edit(METRICS, "import random\n", "import random  # sampling\n", "[Misc] Comment the import (#53001)")
    (repo.path / new).parent.mkdir(parents=True)
    repo.git("mv", METRICS, new)
    text = (repo.path / new).read_text().replace("import random  # sampling\n", "import random  # sampling rate\n")
    (repo.path / new).write_text(text)
    c2 = repo.commit("[Core] Move kv_cache_metrics into metrics/ (#53002)")
    c3 = repo.edit(new, "import random  # sampling rate\n", "import random  # sampling rate (0..1)\n",
                   "[Misc] Say the range (#53003)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, METRICS])
    surface = Surface({BLOCK_POOL}, ["vllm/v1/core/metrics/*.py"])  # only the new home is mirrored
    rep = plan_queue(repo.path, "pin", "main", surface, _dir_tree(tree))
    e1, e2, e3 = rep.entry(c1), rep.entry(c2), rep.entry(c3)
    assert (e1.disposition, e1.status) == ("applicable", "port")  # was 'outside' before
    assert (e2.disposition, e2.status) == ("applicable", "port") and e2.files[0].change == "R"
    assert e2.depends_on == [c1] and e3.depends_on == [c2]
    assert rep.surface.renamed == [f"{METRICS} -> {new}"]
    assert [w.commits for w in rep.waves] == [[c1], [c2], [c3]]


def test_add_then_remove_that_is_no_single_revert_is_net_zero(tmp_path, source):
    """Two additions removed together by one commit: no revert pairs them, the line tracker does."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    a1 = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "[Misc] Add a manager probe (#51401)")
    a2 = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "[Misc] Add BlockPool.debug_dump (#51402)")
    for rel, old, new in ((COORD, PROBE_OLD, PROBE_NEW), (BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW)):
        (repo.path / rel).write_text((repo.path / rel).read_text().replace(new, old))
    rm = repo.commit("[Misc] Drop the debugging helpers (#51403)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    assert [rep.entry(x).status for x in (a1, a2, rm)] == ["net-zero"] * 3
    assert rep.entry(a1).reason == f"add-then-remove: every line it adds is removed again by {rm[:10]}"
    assert rep.waves == []


# ----------------------------------------------------------------------------- 6. superseded


def test_a_conflict_rewritten_later_is_superseded(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    a = repo.edit(*NEW_BLOCKS_MSG, "[Misc] Say how many blocks are free (#54001)")
    b = repo.edit(BLOCK_POOL, NEW_BLOCKS_MSG[2],
                  "raise NoFreeBlocksError(num_blocks, self.get_num_free_blocks())",
                  "[Core] A typed error for an exhausted pool (#54002)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    tree_edit(tree, BLOCK_POOL, *LOCAL_NEW_BLOCKS)  # a local patch on the same line: a is a conflict
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    ea, eb = rep.entry(a), rep.entry(b)
    assert ea.disposition == "conflict" and ea.status == "superseded" and ea.superseded_by == [b]
    assert ea.reason.startswith(f"superseded by {b[:10]}")
    assert eb.status == "port-by-hand" and [w.commits for w in rep.waves] == [[b]]
    # on a tree without the local patch, a is mechanical work and stays queued
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}),
               _dir_tree(make_tree(tmp_path / "plain", source, [BLOCK_POOL])))
    assert rep.entry(a).status == "port"


# ----------------------------------------------------------------------------- deviations and the denominator


def test_deviations_are_flagged_and_gate_pin_advance(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    c1 = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#55001)")
    c2 = repo.edit(*USAGE, "[Bugfix] Float usage (#55002)")
    c3 = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "[Core] Upstream's own probe (#55999)")
    dfile = tmp_path / "sync-decisions.yaml"
    assert sndr_main(["sync", "deviation", "PN0005", "--upstream", "vllm#55999", "--why", "we probe differently",
                     "--discharge", "vllm#55999", "--decisions", str(dfile)]) == 0
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree),
               decisions=load_decisions(dfile).model, patch_files={"PN0005": [COORD]})
    [hit] = rep.deviations
    assert (hit.patch, hit.paths, hit.touched_by, hit.discharge_in_range) == ("PN0005", [COORD], [c1, c3], c3)
    assert "PN0005" in rep.entry(c1).deviations and rep.entry(c2).deviations == []
    assert f"touches deviation PN0005 (vllm#55999); discharged by {c3[:10]}" in rep.entry(c1).flags
    g = gate_deviations(rep, "0.33.0", load_decisions(dfile).model)
    assert not g.ok and "PN0005 (vllm#55999) touched by 2 commit(s)" in g.reason
    assert f"its discharge {c3[:10]} is in range" in g.reason
    text = set_deviation(dfile.read_text(), "PN0005", str(dfile), reviewed="0.33.0")
    assert gate_deviations(rep, "0.33.0", parse_decisions(text).model).ok
    assert not gate_deviations(rep, "0.34.0", load_decisions(dfile).model).ok
    assert sndr_main(["sync", "deviation", "PN0005", "--drop", "--decisions", str(dfile)]) == 0
    assert gate_deviations(rep, "0.33.0", load_decisions(dfile).model).ok
    # explicit paths override the patch's files
    assert sndr_main(["sync", "deviation", "PN0006", "--why", "pool accounting", "--paths", BLOCK_POOL,
                     "--decisions", str(dfile)]) == 0
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree),
               decisions=load_decisions(dfile).model)
    assert [(h.patch, h.touched_by) for h in rep.deviations] == [("PN0006", [c2])]


def test_deviation_reviewed_takes_a_version_or_a_sha_and_matches_the_target_as_a_version(tmp_path, source, capsys):
    """``sync deviation P --reviewed banana`` was recorded (a value no gate can ever match), and
    ``--reviewed 0.33`` did not count for ``pin advance --to 0.33.0`` (compared as strings). Now --reviewed
    is a PEP 440 version (``v``/``vllm==`` prefixes read as elsewhere) or a commit sha, and versions compare
    as versions."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#57001)")
    dfile = tmp_path / "sync-decisions.yaml"
    args = ["sync", "deviation", "PN0005", "--why", "local", "--allow-unknown", "--paths", COORD,
            "--decisions", str(dfile)]
    assert sndr_main([*args, "--reviewed", "banana"]) == 2
    assert "--reviewed 'banana'" in capsys.readouterr().err
    assert not dfile.exists()
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    for reviewed in ("0.33", "v0.33.0", "vllm==0.33.0"):
        assert sndr_main([*args, "--reviewed", reviewed]) == 0, capsys.readouterr().err
        rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree),
                         decisions=load_decisions(dfile).model)
        assert rep.deviations and gate_deviations(rep, "0.33.0", load_decisions(dfile).model).ok, reviewed
        assert not gate_deviations(rep, "0.33.1", load_decisions(dfile).model).ok, reviewed
    assert sndr_main([*args, "--reviewed", "1a2b3c4d5e"]) == 0  # a commit sha target


def test_a_deviation_recorded_after_the_queue_was_planned_still_gates_pin_advance(tmp_path, source):
    """The README's order (plan, then decide and record deviations, then advance): a deviation recorded
    after ``sync plan`` is not in the queue's hits. The gate used to read only those, and passed ("the range
    touches no deviation") with an unreviewed deviation on a file the range changes."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    c1 = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#56001)")
    repo.edit(*USAGE, "[Bugfix] Float usage (#56002)")
    dfile = tmp_path / "sync-decisions.yaml"
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree),
                     decisions=load_decisions(dfile).model, patch_files={"PN0005": [COORD]})
    assert rep.deviations == [] and gate_deviations(rep, "0.33.0", load_decisions(dfile).model).ok
    # recorded after the plan: on the patch's file (COORD), which c1 changes
    assert sndr_main(["sync", "deviation", "PN0005", "--why", "we probe differently", "--allow-unknown",
                      "--paths", COORD, "--decisions", str(dfile)]) == 0
    g = gate_deviations(rep, "0.33.0", load_decisions(dfile).model)
    assert not g.ok and f"PN0005 touched by 1 commit(s) ({c1[:10]}), reviewed for nothing" in g.reason, g.reason
    text = set_deviation(dfile.read_text(), "PN0005", str(dfile), reviewed="0.33.0")
    assert gate_deviations(rep, "0.33.0", parse_decisions(text).model).ok
    dfile.write_text(text)
    # one on a file outside the queue's surface: the queue cannot say whether the range touches it
    assert sndr_main(["sync", "deviation", "PN0006", "--why", "metrics", "--allow-unknown", "--paths", METRICS,
                      "--decisions", str(dfile)]) == 0
    g = gate_deviations(rep, "0.33.0", load_decisions(dfile).model)
    assert not g.ok and "PN0006" in g.reason and "sync plan" in g.reason, g.reason
    # a queue planned with both deviations knows: PN0006 untouched, PN0005 touched and reviewed
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree),
                     decisions=load_decisions(dfile).model)
    assert gate_deviations(rep, "0.33.0", load_decisions(dfile).model).ok


def test_benchmark_reference_gate(tmp_path):
    pre = _pre(tmp_path)
    g = gate_benchmark(None, pre)
    assert not g.ok and "--benchmark-ref" in g.reason
    bench = tmp_path / "bench.json"
    g = gate_benchmark(bench, pre)
    assert not g.ok and "does not exist" in g.reason
    bench.write_text(BENCH)
    os.utime(bench, (500_000, 500_000))
    g = gate_benchmark(bench, pre)
    assert not g.ok and "older than the preflight" in g.reason
    os.utime(bench, (2_000_000, 2_000_000))
    assert gate_benchmark(bench, pre).ok
    assert gate_benchmark(None, pre, "no GPU in this bump").reason == "not required: no GPU in this bump"


# ----------------------------------------------------------------------------- the README walk-through


def test_readme_pin_bump_on_a_clone_with_release_branches(tmp_path, vllm_pin_root, vllm_candidate_root, capsys):
    """``sync plan --from v0.32.0 --to v0.33.0`` on a clone whose tags hold the real 0.32.0 and 0.33.0 files."""
    from sndr.load import load_patch_set
    from sndr.upstream.queue import patch_surface
    from upstream.history import git, release_history

    files = sorted(patch_surface(load_patch_set(None).patches))
    rh = release_history(vllm_pin_root, vllm_candidate_root, files)
    rh.history.write(tmp_path / "vllm-upstream")
    clone = tmp_path / "vllm"
    subprocess.run(["git", "clone", "-q", str(tmp_path / "vllm-upstream"), str(clone)], check=True)
    git(clone, "checkout", "-q", "v0.32.0")
    for f in files:
        if (vllm_candidate_root / f).is_file():
            assert git(clone, "show", f"v0.33.0:{f}") == (vllm_candidate_root / f).read_text().rstrip("\n")
    q = tmp_path / "queue.json"
    rc = sndr_main(["sync", "plan", "--repo", str(clone), "--from", "v0.32.0", "--to", "v0.33.0", "--json", str(q)])
    out = capsys.readouterr()
    assert rc == 1, out.err  # work is queued, nothing decided yet
    rep = json.loads(q.read_text())
    assert rep["from_is_ancestor"] is False and rep["merge_base"] == rh.history.commits[0].sha
    by = {e["sha"]: e for e in rep["commits"]}
    assert by[rh.fix.sha]["status"] == "skip" and by[rh.fix.sha]["cherry_pick_of"] == rh.fix_pick.sha
    assert by[rh.probe.sha]["status"] == by[rh.probe_revert.sha]["status"] == "cancelled"
    assert by[rh.late_pick.sha]["status"] == "port" and rh.late.sha not in by
    assert {u.sha for u in rh.updates} <= {s for w in rep["waves"] for s in w["commits"]}
    assert f"merge-base {rh.history.commits[0].sha[:10]}" in out.out
    assert rep["counts"]["commits"] == len(rh.updates) + 4


# ============================================================================= issue 30: the second round
# Each test scripts the shape real vLLM history showed (squash subjects `Title (#N)`, reverts
# `Revert "Title (#N)" (#M)`, release branches) on the real 0.32.0 files.


def _plan_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = sndr_main(["sync", "plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _version_file(tree: Path, version: str) -> None:
    (tree / "vllm").mkdir(parents=True, exist_ok=True)
    (tree / "vllm" / "version.py").write_text(f'__version__ = "{version}"\n')


# ----------------------------------------------------------------------------- 1. the tree is the pin


def test_a_bare_clone_without_tree_is_refused_naming_the_repo(releases, tmp_path, capsys):
    repo, tree, c = releases
    bare = tmp_path / "vllm.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.path), str(bare)], check=True)
    pdir = _empty(tmp_path)
    rc, out, err = _plan_cli(capsys, "--repo", str(bare), "--from", "v0.32.0", "--to", "v0.33.0",
                             "--patches", str(pdir), "--surface", "vllm/v1/core/*.py")
    assert rc == 2 and "bare_repo" in err and str(bare) in err and "--tree" in err, err
    assert out == ""  # no queue of 'conflict: file missing in the tree'
    # with --tree the same bare clone plans as the checkout does
    rc, out, err = _plan_cli(capsys, "--repo", str(bare), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                             str(tree), "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-")
    data = json.loads(out)
    assert rc == 1 and data["counts"]["cherry_picked"] == 1 and data["counts"].get("conflict", 0) == 0


def test_a_tree_of_another_version_than_the_pin_is_refused(releases, tmp_path, capsys):
    repo, tree, c = releases
    pdir = _empty(tmp_path)
    args = ["--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree", str(tree),
            "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-"]
    _version_file(tree, "0.33.0")  # the target's tree given as --tree
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 2 and "tree_not_pin" in err and "is vLLM 0.33.0, but the pin (--from v0.32.0) is 0.32.0" in err
    assert "--tree vllm==0.32.0" in err
    data = json.loads(out)  # --json -: stdout holds one document, the refusal (no queue)
    assert data["ok"] is False and data["exit_code"] == 2 and [p["code"] for p in data["problems"]] == ["tree_not_pin"]
    _version_file(tree, "0.32.0+cpu")  # a local build of the pin is the pin
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 1 and json.loads(out)["warnings"] == [], err
    # --from a sha: the version comes from the release tag on it, else from the pin record
    _version_file(tree, "0.33.0")
    args[args.index("v0.32.0")] = c["fix_pick"]
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 2 and f"the pin (--from {c['fix_pick']}) is 0.32.0" in err, err
    repo.git("tag", "-d", "v0.32.0")
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 1, err  # nothing says what the pin is: nothing to refuse
    (pdir / "_pin.toml").write_text('version = "0.32.0"\n')
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 2 and "but the pin (the pin record) is 0.32.0" in err, err


def test_a_tree_without_version_that_holds_the_target_is_warned_about(releases, tmp_path, capsys):
    repo, tree, c = releases
    pdir = _empty(tmp_path)
    target = make_tree(tmp_path / "target", tree, [BLOCK_POOL, COORD, METRICS])
    for edit in (TOUCH_COMMENT, TOUCH_INCREMENT, NO_PREFIX):  # v0.33.0's content
        tree_edit(target, *edit)
    rc, out, err = _plan_cli(capsys, "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                             str(target), "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-")
    data = json.loads(out)
    assert f"warning: the tree {target} looks like --to v0.33.0, not the pin: 2 mirrored file(s) hold --to's " \
           "content and 0 --from's" in err, err
    assert any("looks like --to v0.33.0" in w for w in data["warnings"])
    # a tree that holds none of the mirrored files (a wrong directory) is refused
    wrong = tmp_path / "wrong"
    (wrong / "vllm").mkdir(parents=True)
    (wrong / "vllm" / "__init__.py").write_text("")
    rc, out, err = _plan_cli(capsys, "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                             str(wrong), "--patches", str(pdir), "--surface", "vllm/v1/core/*.py")
    assert rc == 2 and "tree_empty" in err and "none of the" in err, err


def _backport_patch(d: Path, pid: str, edits: list[tuple[str, str, str]]) -> None:
    """A local backport: one patch file whose edits make upstream's changes ``(file, old, new)``."""
    d.mkdir(exist_ok=True)
    text = f'id = "{pid}"\ntitle = "backport"\n'
    by_file: dict[str, list[tuple[int, str, str]]] = {}
    for i, (rel, old, new) in enumerate(edits):
        by_file.setdefault(rel, []).append((i, old, new))
    for rel, rows in by_file.items():
        text += f'\n[[files]]\npath = "{rel}"\n'
        for i, old, new in rows:
            text += f"\n[[files.edits]]\nname = \"e{i}\"\nanchor = '''\n{old}'''\nreplacement = '''\n{new}'''\n"
    (d / f"{pid}-backport.toml").write_text(text)


def test_the_pin_patched_by_sndr_with_backports_of_the_range_is_not_taken_for_the_target(releases, tmp_path,
                                                                                          capsys):
    """The README's setup: the pin's tree with the local patches applied, where the local patches are
    backports of range commits. Its patched files then equal --to's, but sndr's ledger says what upstream
    shipped there: no "looks like --to" warning (it used to fire on exactly this tree, and told the
    operator to pass another --tree)."""
    repo, tree, c = releases
    pdir = tmp_path / "backports"
    _backport_patch(pdir, "PB0001", [TOUCH_COMMENT, TOUCH_INCREMENT, NO_PREFIX])
    _version_file(tree, "0.32.0")  # an installed pin knows its version; apply needs it
    assert sndr_main(["apply", "--tree", str(tree), "--patches", str(pdir), "-q"]) == 0
    capsys.readouterr()
    rc, out, err = _plan_cli(capsys, "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                             str(tree), "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-")
    data = json.loads(out)
    assert not any("looks like --to" in w for w in data["warnings"]), data["warnings"]
    assert "looks like --to" not in err, err
    # the queue itself is judged on the patched tree: the backported commits are satisfied
    assert {e["sha"]: e["disposition"] for e in data["commits"]}[c["late_pick"]] == "satisfied"
    # the same bytes without sndr's ledger (a copy of the target's files) are still warned about
    target = make_tree(tmp_path / "copy", tree, [BLOCK_POOL, COORD, METRICS])
    rc, out, err = _plan_cli(capsys, "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree",
                             str(target), "--patches", str(pdir), "--surface", "vllm/v1/core/*.py", "--json", "-")
    assert "looks like --to v0.33.0, not the pin: 2 mirrored file(s)" in err, err


def test_manifest_build_on_a_target_tree_does_not_say_on_the_pin(tmp_path, source, capsys):

    pdir = tmp_path / "patches"
    _write_patch(pdir, "PX0001", BLOCK_POOL, "        this anchor is nowhere\n")
    tree = make_tree(tmp_path / "t", source, [BLOCK_POOL])
    out = tmp_path / "anchors"
    out.mkdir()
    _version_file(tree, "0.33.0")
    assert sndr_main(["manifest", "build", "--tree", str(tree), "--patches", str(pdir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "PX0001.e: drifted on vllm 0.33.0 (a target tree, not the pin 0.32.0)" in err, err
    _version_file(tree, "0.32.0")
    assert sndr_main(["manifest", "build", "--tree", str(tree), "--patches", str(pdir), "--out", str(out)]) == 1
    assert "PX0001.e: drifted on the pin" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 2. 'already present in another form'

#: The 7 manager subclasses that get an override, each with the class that follows it in the file.
STM_SUBCLASSES = [("FullAttentionManager", "RSWAManager"), ("SlidingWindowManager", "CircularBufferManager"),
                  ("CircularBufferManager", "ChunkedLocalAttentionManager"),
                  ("ChunkedLocalAttentionManager", "MambaManager"), ("MambaManager", "CrossAttentionManager"),
                  ("CrossAttentionManager", "SinkFullAttentionManager"),
                  ("SinkFullAttentionManager", "HiSparseSourceManager")]


def _method_before(next_class: str, name: str, value: str) -> tuple[str, str]:
    """(old, new): a method appended to the class that ends where ``next_class`` starts."""
    old = f"\n\n\nclass {next_class}("
    return old, f"\n\n    def {name}(self) -> int:\n        return {value}\n\n\nclass {next_class}("


def _multi_edit(repo: Repo, rel: str, edits: list[tuple[str, str]], message: str) -> str:
    p = repo.path / rel
    text = p.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    p.write_text(text)
    return repo.commit(message)


TAKE_IDS_METHOD = '''    def take_new_block_ids(self) -> list[int]:
        """Drain and return block IDs allocated since the last call."""
        ids = self.new_block_ids
        self.new_block_ids = []
        return ids

'''
STABLE_END = '''        window, as long as the cursor's positional history remains valid.
        """
        return True

'''
CROSS_HEAD = '''class CrossAttentionManager(SingleTypeKVCacheManager):
    """Manager for cross-attention KV cache in encoder-decoder models."""

'''


def test_base_method_with_overrides_a_move_and_a_same_named_method_are_not_twins(tmp_path, source):
    """The shape of 4b364f810e: a base method of SingleTypeKVCacheManager and its override in 7 manager
    subclasses in one commit, in vllm/v1/core/single_type_kv_cache_manager.py; then a move of a method
    within the file (the old copy removed by a later hunk) and an __init__ added to a class that has none."""
    repo = Repo(tmp_path / "up", source, [STM])
    edits = [_method_before("FullAttentionManager", "num_reserved_blocks", "0")]
    edits += [_method_before(nxt, "num_reserved_blocks", str(k + 1)) for k, (_cls, nxt) in enumerate(STM_SUBCLASSES)]
    overrides = _multi_edit(repo, STM, edits, "[Core] Reserve blocks per manager type (#45120)")
    move = _multi_edit(repo, STM, [(TAKE_IDS_METHOD, ""), (STABLE_END, STABLE_END + TAKE_IDS_METHOD)],
                       "[Misc] Keep the block-id accessors together (#45121)")
    init = repo.edit(STM, CROSS_HEAD, CROSS_HEAD + "    def __init__(self, kv_cache_spec, **kwargs) -> None:\n"
                     "        super().__init__(kv_cache_spec, **kwargs)\n        self.cross_only = True\n\n",
                     "[Model] Mark cross-attention managers (#45122)")
    tree = make_tree(tmp_path / "tree", source, [STM])
    rep = plan_queue(repo.path, "pin", "main", Surface({STM}), _dir_tree(tree))
    for sha in (overrides, move, init):
        e = rep.entry(sha)
        assert (e.disposition, e.status) == ("applicable", "port"), e.reason
        assert "already present in another form" not in e.reason
    assert len(rep.entry(overrides).files[0].hunks) == 8  # the base method and 7 overrides
    assert len(rep.entry(move).files[0].hunks) == 2  # added near the top, removed below
    assert rep.counts.get("review", 0) == 0 and rep.counts["queued"] == 3


LOCAL_TWIN = '''    def num_reserved_blocks(self) -> int:
        """Local: the sliding window keeps one spare block."""
        return 1

'''


def test_a_real_twin_in_the_same_class_is_review_naming_the_class_and_the_local_patch(tmp_path, source):
    from sndr.load import load_patch_set
    from sndr.upstream.judge import local_marks

    repo = Repo(tmp_path / "up", source, [STM])
    edits = [_method_before("FullAttentionManager", "num_reserved_blocks", "0")]
    edits += [_method_before(nxt, "num_reserved_blocks", str(k + 1)) for k, (_cls, nxt) in enumerate(STM_SUBCLASSES)]
    overrides = _multi_edit(repo, STM, edits, "[Core] Reserve blocks per manager type (#45120)")
    # the local patch PX0030 already gives SlidingWindowManager its own num_reserved_blocks
    anchor = "class SlidingWindowManager(SingleTypeKVCacheManager):\n"
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PX0030.toml").write_text(
        'id = "PX0030"\ntitle = "spare block"\n\n[[files]]\npath = "' + STM + '"\n\n[[files.edits]]\nname = "e"\n'
        f"anchor = '''\n{anchor}'''\nreplacement = '''\n{anchor}{LOCAL_TWIN}'''\n")
    tree = make_tree(tmp_path / "tree", source, [STM])
    tree_edit(tree, STM, anchor, anchor + LOCAL_TWIN)
    rep = plan_queue(repo.path, "pin", "main", Surface({STM}), _dir_tree(tree),
                     local=local_marks(load_patch_set(pdir).patches))
    e = rep.entry(overrides)
    assert (e.disposition, e.status) == ("review", "port-by-hand")
    line = (tree / STM).read_text().splitlines().index("    def num_reserved_blocks(self) -> int:") + 1
    bad = [h for h in e.files[0].hunks if h.disposition == "review"]
    assert len(bad) == 1  # only SlidingWindowManager's override; the base and the 6 others apply
    assert (f"review: already present in another form: SlidingWindowManager.num_reserved_blocks is defined at "
            f"line {line}; next to local patch PX0030") == bad[0].reason
    assert bad[0].local_patches == ["PX0030"] and "next to local patch PX0030" in e.flags
    assert "PX0030" in render_markdown(rep)


# ----------------------------------------------------------------------------- 3. revert matching

LONG_TITLE = "[Bugfix] Make the block pool say how many blocks are free when it runs out of blocks (#45600)"


def test_reverts_pair_by_pr_number_patch_id_truncated_and_unquoted_subjects(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    pre = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#44000)")
    repo.git("tag", "-f", "pin")  # before the pin: reverting it inside the range is real work
    # 1797576237 / 2a47a9ff0f: the revert names the PR's title as it was edited, not the squash subject
    a = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "[Core] Add a manager probe (#45309)")
    ra = _inverse(repo, COORD, PROBE_OLD, PROBE_NEW, 'Revert "[Core] Add the manager probe for debugging (#45309)" '
                  "(#45400)")
    # a subject that names nothing of the range, with the inverse patch-id of an earlier commit
    b = repo.edit(*USAGE, "[Perf] Float usage (#45500)")
    rb = _inverse(repo, *USAGE, 'Revert "Something else entirely" (#45501)')
    # GitHub's truncated title: the ellipsis, no PR number, no closing quote
    d = repo.edit(*NEW_BLOCKS_MSG, LONG_TITLE)
    rd = _inverse(repo, *NEW_BLOCKS_MSG, 'Revert "[Bugfix] Make the block pool say how many blocks are free '
                  'when it runs o\u2026 (#45601)')
    # unquoted
    e = repo.edit(*TOUCH_COMMENT, "[Misc] Clarify touch() comment (#45700)")
    re_ = _inverse(repo, *TOUCH_COMMENT, "Revert [Misc] Clarify touch() comment (#45700) (#45701)")
    # the GitHub revert button quotes the PR title, which has no (#N): the pre-pin commit's subject has one
    rp = _inverse(repo, *NO_PREFIX, 'Revert "[Core] Explain the no-prefix return" (#45800)')
    # a subject that starts with "Revert" but reverts nothing
    other = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "Revert to the older debug output (#45900)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    tree_edit(tree, *NO_PREFIX)  # the tree is the pin
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    for x, y, how in ((a, ra, "PR number"), (b, rb, "patch-id"), (d, rd, "subject"), (e, re_, "subject")):
        ex, ey = rep.entry(x), rep.entry(y)
        assert ex.status == ey.status == "cancelled", (how, ex.reason, ey.reason, ey.flags)
        assert ey.reverts == x and f"reverts {x[:10]} (paired by {how})" in ey.flags
        assert not any("outside the range" in f for f in ey.flags)
    erp = rep.entry(rp)  # resolved to the pin-side sha, PR suffixes stripped on both sides
    assert erp.reverts == pre and f"reverts {pre[:10]} (outside the range)" in erp.flags and erp.status == "port"
    assert rep.entry(other).reverts is None and not any("reverts" in f for f in rep.entry(other).flags)
    assert rep.counts["reverts_paired"] == 4 and rep.counts["reverts_outside"] == 1


def test_revert_subject_forms():
    from sndr.upstream.reverts import parse_revert, subject_matches

    assert parse_revert('Revert "[Core] Foo (#1)" (#2)') == ("[Core] Foo (#1)", True, [1])
    assert parse_revert('Revert "[Core] A long ti\u2026 (#2)') == ("[Core] A long ti\u2026", True, [])
    assert parse_revert("Revert [Core] Foo (#1) (#2)") == ("[Core] Foo", False, [1])
    assert parse_revert("[Core] Foo (#1)") is None
    assert subject_matches("[Core] A long ti\u2026", "[Core] A long title that went on (#7)")
    assert subject_matches("[Core] A long ti...", "[Core] A long title that went on (#7)")
    assert subject_matches("[Core] Foo", "[Core] Foo (#1) (#9)") and not subject_matches("[Core] Foo", "[Core] Foo2")


# ----------------------------------------------------------------------------- 6. labels

CLAMP = ("        total_gpu_blocks = self.num_gpu_blocks - 1\n",
         "        total_gpu_blocks = self.num_gpu_blocks - 1\n"
         "        total_gpu_blocks = max(total_gpu_blocks, 0)  # sndr PX0050: never negative\n")


def test_a_hunk_applied_with_fuzz_names_the_local_patch_next_to_it(tmp_path, source):
    from sndr.load import load_patch_set
    from sndr.upstream.judge import local_marks

    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    usage = repo.edit(*USAGE, "[Bugfix] Return a float usage (#46001)")
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "PX0050.toml").write_text(
        'id = "PX0050"\ntitle = "clamp"\n\n[[files]]\npath = "' + BLOCK_POOL + '"\n\n[[files.edits]]\nname = "e"\n'
        f"anchor = '''\n{CLAMP[0]}'''\nreplacement = '''\n{CLAMP[1]}'''\n")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    tree_edit(tree, BLOCK_POOL, *CLAMP)  # the local patch sits between the hunk's context lines
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree),
                     local=local_marks(load_patch_set(pdir).patches))
    e = rep.entry(usage)
    [h] = e.files[0].hunks
    assert (e.disposition, e.status, h.fuzz, h.local_patches) == ("applicable", "port", 1, ["PX0050"])
    assert "1 hunk: 1 applicable (1 with fuzz, next to local patch PX0050)" in e.reason
    assert "pre-image found with 1 context line(s); next to local patch PX0050" in e.reason
    assert "next to local patch PX0050" in e.flags
    md = render_markdown(rep)
    assert "| applicable (fuzz 1, next to PX0050) |" in md and "1 applicable (1 with fuzz)" in md
    # without the local patch in the tree the same commit applies with full context and names nothing
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}),
                     _dir_tree(make_tree(tmp_path / "plain", source, [BLOCK_POOL])),
                     local=local_marks(load_patch_set(pdir).patches))
    assert rep.entry(usage).files[0].hunks[0].fuzz is None and rep.entry(usage).flags == []


def test_commits_that_stand_on_a_by_hand_commit_are_blocked_by_it(tmp_path, source, capsys):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    a = repo.edit(*NEW_BLOCKS_MSG, "[Misc] Say how many blocks are free (#47001)")
    b = repo.edit(BLOCK_POOL, '                f"({self.get_num_free_blocks()} free)"\n',
                  '                f"({self.get_num_free_blocks()} free of {self.num_gpu_blocks})"\n',
                  "[Misc] Say of how many (#47002)")
    cc = repo.edit(BLOCK_POOL, "            raise ValueError(\n",
                   "            # the pool is exhausted: say so with numbers\n            raise ValueError(\n",
                   "[Doc] Comment the exhausted pool (#47003)")
    d = repo.edit(BLOCK_POOL, '                f"Cannot get {num_blocks} free blocks from the pool "\n',
                  '                f"Cannot get {num_blocks} free blocks from the KV cache pool "\n',
                  "[Misc] Name the KV cache pool (#47004)")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    tree_edit(tree, BLOCK_POOL, *LOCAL_NEW_BLOCKS)  # a local patch on a's line: a is a port by hand
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    assert rep.entry(a).disposition == "conflict" and rep.entry(a).blocked_by == []
    for x in (b, cc, d):
        e = rep.entry(x)
        assert (e.disposition, e.status, e.blocked_by) == ("conflict", "port-by-hand", [a]), e.reason
        assert e.reason.startswith(f"blocked by {a[:10]} (by hand): every hunk that does not apply stands on")
    assert rep.counts["blocked"] == 3 and rep.counts["conflict"] == 4
    md = render_markdown(rep)
    assert f"1 conflict, 3 blocked by `{a[:10]}` (they apply once it is ported)" in md
    assert md.count(f"| blocked by `{a[:10]}` |") == 3
    g = gate_queue(rep, "main", load_decisions(tmp_path / "none.yaml").model)
    assert f"3 blocked by {a[:10]}: " in g.reason and "1 conflict: " in g.reason
    assert sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
                     "--patches", str(_empty(tmp_path)), "--surface", BLOCK_POOL, "--json",
                     str(tmp_path / "q.json")]) == 1
    assert "4 queued in 4 wave(s), 0 decided, 4 undecided; 3 blocked by a by-hand commit" in capsys.readouterr().out
    # on a tree without the local patch nothing is by hand, so nothing is blocked
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}),
                     _dir_tree(make_tree(tmp_path / "plain", source, [BLOCK_POOL])))
    assert rep.counts["blocked"] == 0 and {rep.entry(x).status for x in (a, b, cc, d)} == {"port"}


def test_a_three_way_cherry_pick_on_the_pin_side_counts_as_cherry_picked(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    fix = repo.edit(*USAGE, "[Bugfix] Return a float usage (#48001)")
    repo.git("checkout", "-q", "-b", "releases/v0.32", "pin")
    # the release branch got it by a 3-way pick whose resolution kept a line of the branch: another patch-id
    for rel, old, new in (USAGE, TOUCH_COMMENT):
        p = repo.path / rel
        p.write_text(p.read_text().replace(old, new))
    pick = repo.commit(f"[Bugfix] Return a float usage (#48001)\n\n(cherry picked from commit {fix})")
    repo.git("tag", "v0.32.0")
    repo.git("checkout", "-q", "main")
    other = repo.edit(*NO_PREFIX, "[Core] Explain the no-prefix return (#48002)")
    repo.git("tag", "v0.33.0")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    for edit in (USAGE, TOUCH_COMMENT):
        tree_edit(tree, *edit)  # the tree is v0.32.0
    rep = plan_queue(repo.path, "v0.32.0", "v0.33.0", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    e = rep.entry(fix)
    assert (e.disposition, e.status, e.cherry_pick_of) == ("satisfied", "skip", pick)
    assert e.reason == (f"cherry-picked onto the pin's side as {pick[:10]} (a 3-way pick: another patch-id, its "
                        "body names this commit); its content is in the tree")
    assert rep.counts["cherry_picked"] == 1 and rep.counts["cherry_picked_3way"] == 1
    assert "1 cherry-picked (1 by a 3-way pick)" in render_markdown(rep)
    assert rep.entry(other).status == "port"


# ----------------------------------------------------------------------------- 5. deviation ids; 7. smaller


def test_deviation_refuses_an_unknown_patch_id(tmp_path, capsys):
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PX0060", BLOCK_POOL, "        return ret\n")
    dfile = tmp_path / "d.yaml"
    base = ["deviation", "--why", "we do it differently", "--patches", str(pdir), "--decisions", str(dfile)]
    assert sndr_main(["sync", *base, "PX0061"]) == 2
    err = capsys.readouterr().err
    assert "unknown_id" in err and "deviation PX0061: no patch PX0061" in err and "PX0060" in err, err
    assert not dfile.exists()
    assert sndr_main(["sync", *base, "PX0061", "--allow-unknown"]) == 2  # it would live in no file
    assert "--allow-unknown needs --paths" in capsys.readouterr().err and not dfile.exists()
    assert sndr_main(["sync", *base, "PX0061", "--allow-unknown", "--paths", BLOCK_POOL]) == 0
    assert sndr_main(["sync", *base, "PX0060"]) == 0
    assert [d.patch for d in load_decisions(dfile).model.deviations] == ["PX0061", "PX0060"]


def test_select_of_a_commit_outside_the_surface_is_named(scripted, capsys):
    repo, tree, c = scripted
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree), select=[c["outside"][:10]])
    p = exc.value.problems[0]
    assert p.code == "bad_select" and c["outside"][:10] in p.message and "'metrics: comment'" in p.message
    assert "outside the mirrored surface" in p.message and "--surface" in p.hint
    # a commit on the surface that the queue does not hold is queued nothing, and said so
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree),
                     select=[c["satisfied"], c["series1"]])
    assert [w.commits for w in rep.waves] == [[c["series1"]]]
    assert any(w.startswith(f"--select {c['satisfied'][:10]} ('Return a float usage') queues nothing: it is skip")
               for w in rep.warnings), rep.warnings


def test_decide_checks_the_sha_without_a_queue(scripted, tmp_path, capsys):
    repo, tree, c = scripted
    dfile = tmp_path / "d.yaml"
    common = ["--tier", "INVENTORY", "--decisions", str(dfile)]
    assert sndr_main(["sync", "decide", "12", *common]) == 2
    assert "'12' is too short to name a commit: give 7 to 40 hex digits" in capsys.readouterr().err
    assert sndr_main(["sync", "decide", "xyz1234", *common]) == 2
    assert "is not a commit sha" in capsys.readouterr().err
    assert sndr_main(["sync", "decide", "1234567", *common]) == 2  # any hex prefix: nothing to check it against
    err = capsys.readouterr().err
    assert "names no commit of the decisions file" in err and "--queue" in err and "--repo" in err, err
    assert sndr_main(["sync", "decide", "1234567", "--repo", str(repo.path), *common]) == 2
    assert f"'1234567' names no commit in {repo.path}" in capsys.readouterr().err
    assert not dfile.exists()
    assert sndr_main(["sync", "decide", c["conflict"][:9], "--repo", str(repo.path), *common]) == 0
    [d] = load_decisions(dfile).model.decisions
    assert (d.sha, d.subject) == (c["conflict"], "Say how many blocks are free")  # resolved, subject taken
    # a prefix of a decision the file already has names it
    assert sndr_main(["sync", "decide", c["conflict"][:8], "--resolution", "deferred", "--decisions", str(dfile)]) == 0
    assert load_decisions(dfile).model.decisions[0].resolution == "deferred"
    # with --queue, a short prefix says too short, not 'more than one'
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    q = tmp_path / "q.json"
    q.write_text(rep.model_dump_json())
    assert sndr_main(["sync", "decide", c["conflict"][:4], "--queue", str(q), *common]) == 2
    assert "too short" in capsys.readouterr().err


def test_decide_from_file_records_a_batch_at_once(scripted, tmp_path, capsys):
    repo, tree, c = scripted
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    q = tmp_path / "q.json"
    q.write_text(rep.model_dump_json())
    dfile = tmp_path / "d.yaml"
    batch = tmp_path / "batch.yaml"
    batch.write_text(f"# the 0.33 bump meeting\n- sha: {c['series1'][:10]}\n  tier: PORT-NOW\n  resolution: deferred\n"
                     f"- sha: {c['series2'][:10]}\n  resolution: not-needed covered by series1\n"
                     f"- sha: {c['conflict'][:10]}\n  tier: IGNORE\n  resolution: later\n")
    assert sndr_main(["sync", "decide", "--from-file", str(batch), "--queue", str(q), "--decisions", str(dfile)]) == 2
    err = capsys.readouterr().err
    assert f"{batch}:9 [resolution]: row 3:" in err and "resolution" in err, err  # the file and the line
    assert not dfile.exists()  # nothing written while one row is bad
    batch.write_text(batch.read_text().replace("resolution: later", "resolution: not-needed local message wins"))
    assert sndr_main(["sync", "decide", "--from-file", str(batch), "--queue", str(q), "--decisions", str(dfile)]) == 0
    assert "3 decision(s) recorded" in capsys.readouterr().out
    got = {d.sha: (d.subject, d.tier, d.resolution) for d in load_decisions(dfile).model.decisions}
    assert got == {c["series1"]: ("Clarify touch() comment", "PORT-NOW", "deferred"),
                   c["series2"]: ("touch(): spell out the increment", None, "not-needed covered by series1"),
                   c["conflict"]: ("Say how many blocks are free", "IGNORE", "not-needed local message wins")}
    assert sndr_main(["sync", "decide", c["series1"], "--from-file", str(batch), "--decisions", str(dfile)]) == 2


def test_benchmark_ref_and_its_waiver_are_exclusive(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(BENCH)
    assert sndr_main(["pin", "advance", "--to", "0.33.0", "--benchmark-ref", str(bench), "--no-benchmark-ref", "CPU only",
                     "--dry-run"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_markdown_sections_sit_under_the_title(scripted, tmp_path):
    repo, tree, c = scripted
    dfile = tmp_path / "d.yaml"
    assert sndr_main(["sync", "decide", c["conflict"], "--resolution", "deferred", "--decisions", str(dfile)]) == 0
    md = render_markdown(plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree),
                                    decisions=load_decisions(dfile).model))
    heads = [ln for ln in md.splitlines() if ln.startswith("#")]
    assert heads[0].startswith("# Sync queue: ") and all(not h.startswith("# ") for h in heads[1:]), heads
    assert heads.index("## Undecided") < heads.index("### Wave 1") < heads.index("## Decided") \
        < heads.index("## Not queued")


def test_the_repos_own_work_tree_is_checked_by_its_head(releases, tmp_path, capsys):
    repo, tree, c = releases
    pdir = _empty(tmp_path)
    args = ["--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--patches", str(pdir),
            "--surface", "vllm/v1/core/*.py", "--json", "-"]
    repo.git("checkout", "-q", "v0.33.0")  # the work tree is the target
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 2 and "tree_not_pin" in err and "contains --to v0.33.0: it is the target, not the pin" in err, err
    repo.git("checkout", "-q", "v0.32.0")
    repo.git("checkout", "-q", "-b", "local")  # local patches committed on top of the pin are the pin
    (repo.path / BLOCK_POOL).write_text((repo.path / BLOCK_POOL).read_text() + "# local\n")
    repo.commit("local patch")
    rc, out, err = _plan_cli(capsys, *args)
    assert rc == 1 and json.loads(out)["warnings"] == [], err


def test_a_revert_cut_without_an_ellipsis_pairs_and_one_that_does_more_never_cancels(tmp_path, source):
    """The new-user review (stop 44), on scripted history: (1) a revert subject cut by a line limit, with no
    ellipsis and no closing quote, even inside the PR suffix (`Revert "Title (#45`), pairs by prefix like
    GitHub's own ellipsis; it was "outside the range" and both halves were port work. (2) A revert whose diff
    is not the inverse of the original (it also changes another line) was "cancelled" with the original, so
    its extra line dropped out of the queue unsaid: such a pair now stays queued, in order, flagged."""
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, COORD])
    repo.git("tag", "-f", "pin")
    d = repo.edit(*NEW_BLOCKS_MSG, LONG_TITLE)
    rd = _inverse(repo, *NEW_BLOCKS_MSG, 'Revert "[Bugfix] Make the block pool say how many blocks are free when '
                  'it runs out of blocks (#456')
    u = repo.edit(*USAGE, "[Perf] Float usage (#45700)")
    p = repo.path / COORD
    p.write_text(p.read_text().replace(PROBE_OLD, PROBE_NEW))  # the revert also changes another file
    ru = _inverse(repo, *USAGE, 'Revert "[Perf] Float usage (#45700)" (#45701)')
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL, COORD}), _dir_tree(tree))
    ed, erd = rep.entry(d), rep.entry(rd)
    assert ed.status == erd.status == "cancelled", (ed.reason, erd.reason, erd.flags)
    assert erd.reverts == d and f"reverts {d[:10]} (paired by subject)" in erd.flags
    assert not any("outside the range" in f for f in erd.flags)
    eu, eru = rep.entry(u), rep.entry(ru)
    assert eu.status == eru.status == "port", (eu.status, eru.status, eru.reason)
    assert eru.reverts == u and any("not an exact inverse" in f for f in eu.flags + eru.flags)
    assert rep.counts["reverts_outside"] == 0


def test_a_bad_sync_config_names_its_line(tmp_path):
    from sndr.upstream.queue import load_sync_config

    cfg = tmp_path / "_sync.toml"
    for text, code, line in (('# the surface\nsurface = "vllm/*"\n', "bad_sync_config", 2),
                             ('surface = ["vllm/*"]\n\nsurfaces = []\n', "bad_sync_config", 3),
                             ('# x\nsurface = ["vllm/*",,]\n', "toml_syntax", 2)):
        cfg.write_text(text)
        with pytest.raises(SndrError) as exc:
            load_sync_config(cfg)
        p = exc.value.problems[0]
        assert (p.code, p.file, p.line) == (code, str(cfg), line), p
    cfg.write_text('surface = ["vllm/*", "tests/*"]\n')
    assert load_sync_config(cfg) == ["vllm/*", "tests/*"]
