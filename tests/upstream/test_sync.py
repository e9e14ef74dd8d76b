"""The sync queue and the pin gates, on real git repositories with scripted histories.

The repositories start from real vLLM 0.32.0 files; each scripted commit is a
small upstream change. The "current tree" is a separate directory: the pin's
files plus whatever the scenario says was already ported or patched locally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.errors import SndrError
from sndr.load import PatchSet
from sndr.upstream.sync import (
    PIN_FILE_NAME,
    LineTracker,
    Surface,
    advance,
    classify_hunk,
    parse_hunks,
    patch_surface,
    plan_queue,
    read_pin,
    render_markdown,
)

BLOCK_POOL = "vllm/v1/core/block_pool.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"
STM = "vllm/v1/core/single_type_kv_cache_manager.py"
STM_NEW = "vllm/v1/core/single_type_manager.py"
METRICS = "vllm/v1/core/kv_cache_metrics.py"  # outside the surface
BASE_FILES = [BLOCK_POOL, COORD, STM, METRICS]
SURFACE = Surface({BLOCK_POOL, COORD, STM})

GIT_ENV = {
    "GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "up@example.invalid",
    "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "up@example.invalid",
    "GIT_AUTHOR_DATE": "2026-07-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-07-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}


class Repo:
    """A scripted upstream: every method makes one commit and returns its sha."""

    def __init__(self, path: Path, source: Path, files: list[str]):
        self.path = path
        path.mkdir()
        self.git("init", "-q", "-b", "main")
        for rel in files:
            dst = path / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, dst)
        self.base = self.commit("pin: vLLM 0.32.0 files")
        self.git("tag", "pin")

    def git(self, *args: str) -> str:
        env = {**os.environ, **GIT_ENV}
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True,
                              text=True, env=env).stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def edit(self, rel: str, old: str, new: str, message: str) -> str:
        p = self.path / rel
        text = p.read_text()
        assert text.count(old) == 1, f"{old!r} is not unique in {rel}"
        p.write_text(text.replace(old, new))
        return self.commit(message)

    def revert(self, sha: str) -> str:
        self.git("revert", "--no-edit", sha)
        return self.git("rev-parse", "HEAD")

    def rename(self, old: str, new: str, message: str) -> str:
        self.git("mv", old, new)
        return self.commit(message)


def make_tree(dst: Path, source: Path, files: list[str]) -> Path:
    for rel in files:
        d = dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, d)
    return dst


def tree_edit(tree: Path, rel: str, old: str, new: str) -> None:
    p = tree / rel
    text = p.read_text()
    assert text.count(old) == 1
    p.write_text(text.replace(old, new))


# The scripted edits, as (file, old, new).
USAGE = (BLOCK_POOL, "        if not total_gpu_blocks:\n            return 0\n",
         "        if not total_gpu_blocks:\n            return 0.0\n")
TOUCH_COMMENT = (BLOCK_POOL,
                 "            # ref_cnt=0 means this block is in the free list (i.e. eviction\n"
                 "            # candidate), so remove it.\n",
                 "            # A block with ref_cnt == 0 sits in the free queue as an eviction\n"
                 "            # candidate: take it out before handing it to another request.\n")
TOUCH_INCREMENT = (BLOCK_POOL,
                   "                self.free_block_queue.remove(block)\n            block.ref_cnt += 1\n"
                   "            if self.metrics_collector:\n                self.metrics_collector.on_block_accessed(block)\n",
                   "                self.free_block_queue.remove(block)\n            block.ref_cnt = block.ref_cnt + 1\n"
                   "            if self.metrics_collector:\n                self.metrics_collector.on_block_accessed(block)\n")
NEW_BLOCKS_MSG = (BLOCK_POOL, 'raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")',
                  'raise ValueError(\n                f"Cannot get {num_blocks} free blocks from the pool "\n'
                  '                f"({self.get_num_free_blocks()} free)"\n            )')
LOCAL_NEW_BLOCKS = ('raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")',
                    'raise ValueError(f"[local] pool exhausted: wanted {num_blocks} blocks")')
DEBUG_DUMP_OLD = '''    def is_block_writable(self, block: KVCacheBlock) -> bool:
        """Return whether a block can be mutated by its sole owner."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None
'''
DEBUG_DUMP_NEW = DEBUG_DUMP_OLD + '''
    def debug_dump(self) -> dict[str, int]:
        """Counters for a debugging endpoint."""
        return {"free": self.get_num_free_blocks(), "total": self.num_gpu_blocks}
'''
PROBE_OLD = '''    def new_step_starts(self) -> None:
        """Notify each manager that a new step is starting."""
        for manager in self.single_type_managers:
            manager.new_step_starts()
'''
PROBE_NEW = PROBE_OLD + '''
    def probe_managers(self) -> int:
        """Temporary probe: how many managers answered new_step_starts."""
        return len(self.single_type_managers)
'''
REMOVED_PROBE_NEW = PROBE_OLD  # the probe is dropped again, by hand (not a git revert)
TAKE_IDS = (STM_NEW, '        """Drain and return block IDs allocated since the last call."""\n',
            '        """Drain and return the block IDs allocated since the last call."""\n')
NO_PREFIX = (COORD, "        return blocks, 0, 0\n", "        return blocks, 0, 0  # no prefix cache: never a hit\n")


@pytest.fixture(scope="module")
def source(vllm_pin_root) -> Path:
    return vllm_pin_root


@pytest.fixture
def scripted(tmp_path, source):
    """The main scripted history and the shas of its commits by role."""
    repo = Repo(tmp_path / "upstream", source, BASE_FILES)
    c = {}
    c["satisfied"] = repo.edit(*USAGE, "Return a float usage")
    c["series1"] = repo.edit(*TOUCH_COMMENT, "Clarify touch() comment")
    c["outside"] = repo.edit(METRICS, "import random\n", "import random  # sampling\n", "metrics: comment")
    c["series2"] = repo.edit(*TOUCH_INCREMENT, "touch(): spell out the increment")
    c["conflict"] = repo.edit(*NEW_BLOCKS_MSG, "Say how many blocks are free")
    c["added"] = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "Add BlockPool.debug_dump")
    c["reverted"] = repo.revert(c["added"])
    c["probe_add"] = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "Add a manager probe")
    c["probe_remove"] = repo.edit(COORD, PROBE_NEW, REMOVED_PROBE_NEW, "Drop the manager probe")
    c["rename"] = repo.rename(STM, STM_NEW, "Rename single_type_kv_cache_manager")
    c["after_rename"] = repo.edit(*TAKE_IDS, "Docstring wording")
    c["independent"] = repo.edit(*NO_PREFIX, "Explain the no-prefix-cache return")
    tree = make_tree(tmp_path / "tree", source, BASE_FILES)
    tree_edit(tree, *USAGE)  # ported earlier
    tree_edit(tree, BLOCK_POOL, *LOCAL_NEW_BLOCKS)  # a local patch on the same line as "conflict"
    return repo, tree, c


def by_role(rep, c):
    return {role: rep.entry(sha) for role, sha in c.items()}


def test_every_disposition_and_order(scripted):
    repo, tree, c = scripted
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    e = by_role(rep, c)
    assert rep.counts["commits"] == 12
    assert [x.sha for x in rep.commits] == [c[k] for k in c]  # upstream order
    assert (e["satisfied"].disposition, e["satisfied"].status) == ("satisfied", "skip")
    assert (e["outside"].disposition, e["outside"].status) == ("outside", "skip")
    assert (e["series1"].disposition, e["series1"].status) == ("applicable", "port")
    # series2's context is series1's new text: judged after series1 on the simulated tree
    assert (e["series2"].disposition, e["series2"].status) == ("applicable", "port")
    assert e["series2"].depends_on == [c["series1"]]
    assert (e["conflict"].disposition, e["conflict"].status) == ("conflict", "port-by-hand")
    assert "neither the pre-image nor the post-image" in e["conflict"].reason
    assert e["added"].status == e["reverted"].status == "cancelled"
    assert e["added"].pair == c["reverted"] and e["reverted"].pair == c["added"]
    # the hand-written removal is the exact inverse of the addition: a silent revert, paired by patch-id
    assert e["probe_add"].status == e["probe_remove"].status == "cancelled"
    assert f"reverts {c['probe_add'][:10]} (paired by patch-id)" in e["probe_remove"].flags
    assert (e["rename"].disposition, e["rename"].status) == ("applicable", "port")
    assert e["rename"].files[0].change == "R" and e["rename"].files[0].old_path == STM
    assert (e["after_rename"].disposition, e["after_rename"].status) == ("applicable", "port")
    assert e["after_rename"].depends_on == [c["rename"]]
    assert (e["independent"].disposition, e["independent"].status) == ("applicable", "port")

    waves = [[rep.entry(s).sha for s in w.commits] for w in rep.waves]
    assert waves == [
        [c["series1"], c["conflict"], c["rename"], c["independent"]],
        [c["series2"], c["after_rename"]],
    ]
    assert rep.counts["queued"] == 6
    assert rep.findings == []


def _dir_tree(path: Path):
    from sndr.tree import DirTree

    return DirTree(path)


def test_series_member_alone_matches_only_with_reduced_context(scripted):
    """Judged on the plain tree (its predecessor not carried), the series' second commit needs fuzz."""
    repo, tree, c = scripted
    rep = plan_queue(repo.path, c["series1"], "main", SURFACE, _dir_tree(tree))
    e = rep.entry(c["series2"])
    assert e.disposition == "applicable" and e.depends_on == []
    assert [h.fuzz for h in e.files[0].hunks] == [1]
    assert "1 context line" in e.files[0].hunks[0].reason
    # on the full range it matches with full context, after its predecessor
    full = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree)).entry(c["series2"])
    assert [h.fuzz for h in full.files[0].hunks] == [None]


def test_ported_commits_turn_satisfied(scripted, source):
    repo, tree, c = scripted
    for edit in (TOUCH_COMMENT, TOUCH_INCREMENT, NO_PREFIX):
        tree_edit(tree, *edit)
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    e = by_role(rep, c)
    assert e["series1"].disposition == e["series2"].disposition == e["independent"].disposition == "satisfied"
    assert [w.commits for w in rep.waves] == [[c["conflict"], c["rename"]], [c["after_rename"]]]


def test_rename_already_ported(scripted):
    repo, tree, c = scripted
    (tree / STM).rename(tree / STM_NEW)
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    e = by_role(rep, c)
    assert e["rename"].disposition == "satisfied"
    assert "already renamed" in e["rename"].reason
    assert e["after_rename"].disposition == "applicable"
    assert e["after_rename"].wave == 1  # its dependency is no longer queued


def test_half_ported_revert_pair_is_refused(scripted):
    repo, tree, c = scripted
    tree_edit(tree, BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW)  # the tree carries the reverted commit
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    e = by_role(rep, c)
    assert e["added"].disposition == "satisfied" and e["reverted"].disposition == "applicable"
    assert e["added"].status == e["reverted"].status == "refused"
    assert "porting one half alone is refused" in e["reverted"].reason
    assert [f["code"] for f in rep.findings] == ["revert_pair_half_ported"]
    assert all(c["reverted"] not in w.commits for w in rep.waves)


def test_select_refuses_half_a_revert_pair_and_a_broken_series(scripted):
    repo, tree, c = scripted
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree), select=[c["added"][:12]])
    assert exc.value.problems[0].code == "revert_pair_split"
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree), select=[c["series2"]])
    assert exc.value.problems[0].code == "series_split"
    assert c["series1"][:10] in exc.value.problems[0].message
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree),
               select=[c["series1"], c["series2"], c["added"], c["reverted"]])
    assert [w.commits for w in rep.waves] == [[c["series1"]], [c["series2"]]]
    assert rep.entry(c["independent"]).wave is None


def test_add_then_remove_with_extra_work_is_flagged_not_skipped(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [COORD])
    add = repo.edit(COORD, PROBE_OLD, PROBE_NEW, "Add a manager probe")
    # the removal also rewrites a line elsewhere: its net effect is not zero
    text = (repo.path / COORD).read_text().replace(PROBE_NEW, PROBE_OLD).replace(*NO_PREFIX[1:])
    (repo.path / COORD).write_text(text)
    rm = repo.commit("Drop the probe, explain the no-prefix return")
    tree = make_tree(tmp_path / "tree", source, [COORD])
    rep = plan_queue(repo.path, "pin", "main", Surface({COORD}), _dir_tree(tree))
    a, r = rep.entry(add), rep.entry(rm)
    assert a.status == "port" and any(f.startswith("net-zero lines") for f in a.flags)
    assert r.status == "port" and r.depends_on == [add]
    assert [w.commits for w in rep.waves] == [[add], [rm]]


def test_revert_of_revert_restores_the_original(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL])
    add = repo.edit(BLOCK_POOL, DEBUG_DUMP_OLD, DEBUG_DUMP_NEW, "Add BlockPool.debug_dump")
    r1 = repo.revert(add)
    r2 = repo.revert(r1)
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL])
    rep = plan_queue(repo.path, "pin", "main", Surface({BLOCK_POOL}), _dir_tree(tree))
    assert rep.entry(add).status == "port"
    assert rep.entry(r1).status == rep.entry(r2).status == "cancelled"
    assert rep.entry(r1).pair == r2


def test_new_and_deleted_files_on_a_glob_surface(tmp_path, source):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, METRICS])
    (repo.path / "vllm/v1/core/block_stats.py").write_text("def stats() -> int:\n    return 0\n")
    add = repo.commit("Add block_stats")
    (repo.path / METRICS).unlink()
    rm = repo.commit("Delete kv_cache_metrics")
    follow = repo.edit("vllm/v1/core/block_stats.py", "return 0\n", "return 1\n", "stats: 1")
    tree = make_tree(tmp_path / "tree", source, [BLOCK_POOL, METRICS])
    rep = plan_queue(repo.path, "pin", "main", Surface(set(), ["vllm/v1/core/*.py"]), _dir_tree(tree))
    assert rep.entry(add).disposition == "applicable" and rep.entry(add).files[0].change == "A"
    assert rep.entry(rm).disposition == "applicable" and rep.entry(rm).files[0].change == "D"
    assert rep.entry(follow).depends_on == [add]
    assert [w.commits for w in rep.waves] == [[add, rm], [follow]]
    # a locally modified file that upstream deletes is a conflict
    tree_edit(tree, METRICS, "import random\n", "import random  # local\n")
    assert plan_queue(repo.path, "pin", "main", Surface(set(), ["vllm/v1/core/*.py"]),
                _dir_tree(tree)).entry(rm).disposition == "conflict"


def test_bad_ranges_are_bad_input(scripted):
    repo, tree, c = scripted
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "main", "pin", SURFACE, _dir_tree(tree))
    assert exc.value.problems[0].code == "backwards_range" and exc.value.exit_code == 2
    with pytest.raises(SndrError) as exc:
        plan_queue(repo.path, "nope", "main", SURFACE, _dir_tree(tree))
    assert exc.value.problems[0].code == "unknown_rev"


def test_markdown_lists_waves_in_order(scripted):
    repo, tree, c = scripted
    md = render_markdown(plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree)))
    assert md.index("## Wave 1") < md.index("## Wave 2") < md.index("## Not queued")
    assert md.index(c["series1"][:10]) < md.index(c["series2"][:10])
    assert "cancelled" in md and "net-zero" in md


# ----------------------------------------------------------------------------- units


def test_classify_hunk_levels():
    text = "a\nb\nc\nold\nd\ne\nf\n"
    hunks, _ = parse_hunks("@@ -1,7 +1,7 @@\n a\n b\n c\n-old\n+new line here\n d\n e\n f\n")
    res, new = classify_hunk(text, hunks[0])
    assert res.disposition == "applicable" and new == "a\nb\nc\nnew line here\nd\ne\nf\n"
    res, _ = classify_hunk(new, hunks[0])
    assert res.disposition == "satisfied"
    res, _ = classify_hunk("x\ny\n", hunks[0])
    assert res.disposition == "conflict"


def test_parse_hunks_no_newline_at_eof():
    hunks, binary = parse_hunks("@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n")
    assert not binary
    assert hunks[0].image("pre") == "a" and hunks[0].image("post") == "b"
    assert parse_hunks("Binary files a/x and b/x differ\n") == ([], True)


def test_line_tracker_overlap():
    t = LineTracker(lambda rev, path: 20)
    from sndr.upstream.sync import GitFileChange

    h1 = parse_hunks("@@ -4,7 +4,7 @@\n l4\n l5\n l6\n-l7\n+L7\n l8\n l9\n l10\n")[0]
    h2 = parse_hunks("@@ -7,7 +7,7 @@\n L7\n l8\n l9\n-l10\n+L10\n l11\n l12\n l13\n")[0]
    h3 = parse_hunks("@@ -14,7 +14,7 @@\n l14\n l15\n l16\n-l17\n+L17\n l18\n l19\n l20\n")[0]
    assert t.commit(0, "p", [GitFileChange("M", "f", hunks=h1)], lambda p: 0) == set()
    assert t.commit(1, "p", [GitFileChange("M", "f", hunks=h2)], lambda p: 0) == {0}
    assert t.commit(2, "p", [GitFileChange("M", "f", hunks=h3)], lambda p: 0) == set()



def test_a_change_names_the_paths_it_touches():
    """GitFileChange.paths: the one reading of the files a change touches (the line tracker's rename dependencies,
    the re-land rule's file overlap): a rename or copy touches both of its paths."""
    from sndr.upstream.sync import GitFileChange

    assert GitFileChange("M", "a.py").paths == ("a.py",)
    assert GitFileChange("R", "b.py", old_path="a.py").paths == ("b.py", "a.py")
    assert GitFileChange("C", "c.py", old_path="a.py").paths == ("c.py", "a.py")


def test_patch_surface_skips_retired_and_maps_runtime_targets():
    from sndr.model import Patch

    text = Patch(id="PN1", title="t", files=[{"path": BLOCK_POOL, "edits": [
        {"name": "e", "anchor": "a", "replacement": "b"}]}])
    retired = Patch(id="PN2", title="t", lifecycle="retired", files=[{"path": COORD, "edits": [
        {"name": "e", "anchor": "a", "replacement": "b"}]}])
    rt = Patch(id="PN3", title="t", kind="runtime", runtime=[{
        "name": "r", "target": "vllm.v1.core.sched.scheduler:Scheduler.schedule",
        "replacement": "sndr.kernels.x:schedule"}])
    assert patch_surface([text, retired, rt]) == {
        BLOCK_POOL, "vllm/v1/core/sched/scheduler.py", "vllm/v1/core/sched/scheduler/__init__.py"}


# ----------------------------------------------------------------------------- CLI


def _write_patch(d: Path, pid: str, path: str, anchor: str) -> None:
    d.mkdir(exist_ok=True)
    (d / f"{pid}.toml").write_text(
        f'id = "{pid}"\ntitle = "t"\n\n[[files]]\npath = "{path}"\n\n[[files.edits]]\nname = "e"\n'
        f"anchor = '''\n{anchor}'''\nreplacement = '''\n{anchor.rstrip()}  # patched\n'''\n")


def test_cli_plan_writes_json_and_markdown(scripted, tmp_path, capsys):
    repo, tree, c = scripted
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PN1", BLOCK_POOL, "        return ret\n")
    _write_patch(pdir, "PN2", STM, "        return ids\n")
    (pdir / "_sync.toml").write_text('surface = ["vllm/v1/core/kv_cache_coord*.py"]\n')
    out_json, out_md = tmp_path / "q.json", tmp_path / "q.md"
    rc = sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
                   "--patches", str(pdir), "--json", str(out_json), "--md", str(out_md)])
    assert rc == 1  # work is queued
    data = json.loads(out_json.read_text())
    assert data["surface"]["files"] == [BLOCK_POOL, STM]
    assert data["surface"]["globs"] == ["vllm/v1/core/kv_cache_coord*.py"]
    assert [w["commits"] for w in data["waves"]][0][0] == c["series1"]
    assert "## Wave 2" in out_md.read_text()
    rc = sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
                   "--patches", str(pdir), "--select", c["series2"]])
    assert rc == 2
    assert "series_split" in capsys.readouterr().err


def test_cli_plan_on_an_empty_queue_exits_0(tmp_path, source, capsys):
    repo = Repo(tmp_path / "up", source, [BLOCK_POOL, METRICS])
    repo.edit(METRICS, "import random\n", "import random  # x\n", "outside only")
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PN1", BLOCK_POOL, "        return ret\n")
    repo.git("checkout", "-q", "pin")  # the work tree is the pin's (a checkout of --to is refused: tree_not_pin)
    rc = sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--patches", str(pdir)])
    assert rc == 0
    assert "0 applicable" in capsys.readouterr().out


# ----------------------------------------------------------------------------- pin advance

GOOD_PREFLIGHT = {"pin": "0.32.0", "candidate": {"version": "0.33.0", "tree_digest": "a" * 64}, "patches": [],
                  "summary": {}, "genuine_anchor_drift": [], "retired_upstream": [], "newly_merged": [],
                  "newly_reverted": [], "patch_set": {"digest": PatchSet([]).digest()},
                  "performance": []}  # run on an empty set (so no performance plugin either)
#: a benchmark reference: it records at least one measurement
BENCH = '{"output_throughput_tok_s": 1234.5}'


def _queue(tmp_path, scripted, port_all: bool = False) -> Path:
    repo, tree, c = scripted
    if port_all:  # port everything mechanical: the queue is left with the conflict only
        for e in (TOUCH_COMMENT, TOUCH_INCREMENT, NO_PREFIX):
            tree_edit(tree, *e)
        (tree / STM).rename(tree / STM_NEW)
        tree_edit(tree, *TAKE_IDS)
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))
    rep.to_ref = "v0.33.0"
    p = tmp_path / "queue.json"
    p.write_text(rep.model_dump_json())
    return p


@pytest.fixture
def gates_ok(tmp_path, scripted):
    pre = tmp_path / "pre.json"
    pre.write_text(json.dumps(GOOD_PREFLIGHT))
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    (anchors / "vllm-0.33.0.json").write_text(json.dumps({"vllm_version": "0.33.0", "patches": []}))
    q = _queue(tmp_path, scripted, port_all=True)
    # the one conflict left is decided; the benchmark was re-measured after the preflight
    decisions = tmp_path / "sync-decisions.yaml"
    assert sndr_main(["sync", "decide", scripted[2]["conflict"], "--tier", "INVENTORY", "--resolution",
                     "not-needed the local message wins", "--decisions", str(decisions)]) == 0
    bench = tmp_path / "bench-0.33.0.json"
    bench.write_text(BENCH)
    os.utime(pre, (1_000_000, 1_000_000))
    return pre, anchors, q


def _kw(tmp_path: Path) -> dict:
    return {"decisions": tmp_path / "sync-decisions.yaml", "benchmark": tmp_path / "bench-0.33.0.json"}


def test_pin_advance_records_the_pin_when_every_gate_passes(tmp_path, gates_ok):
    pre, anchors, q = gates_ok
    pin_file = tmp_path / PIN_FILE_NAME
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, pin_path=pin_file, **_kw(tmp_path))
    assert [(g.name, g.ok) for g in gates] == [("preflight", True), ("manifest", True), ("queue", True),
                                                ("deviations", True), ("benchmark", True), ("performance", True)], gates
    assert rec.version == "0.33.0" and rec.tree_digest == "a" * 64
    assert rec.benchmark_ref == str(tmp_path / "bench-0.33.0.json") and len(rec.benchmark_sha256) == 64
    assert read_pin(pin_file) == rec
    assert "every queued commit decided (1: 1 not-needed)" in gates[2].reason


@pytest.mark.parametrize("gate", ["preflight", "manifest", "queue"])
def test_pin_advance_refuses_and_names_the_gate(tmp_path, gates_ok, scripted, gate, capsys):
    pre, anchors, q = gates_ok
    if gate == "preflight":
        pre.write_text(json.dumps({**GOOD_PREFLIGHT, "genuine_anchor_drift": [{"patch": "PN346", "edit": "clamp"}]}))
    elif gate == "manifest":
        (anchors / "vllm-0.33.0.json").unlink()
    else:
        tree = scripted[1]
        (tree / STM_NEW).rename(tree / STM)  # un-port the rename: it is applicable again
        q = _queue(tmp_path, scripted)
    pin_file = tmp_path / PIN_FILE_NAME
    rc = sndr_main(["pin", "advance", "--to", "0.33.0", "--preflight", str(pre), "--queue", str(q),
                   "--manifest", str(anchors / "vllm-0.33.0.json"), "--patches", str(_empty_patches(tmp_path)),
                   "--pin-file", str(pin_file), "--decisions", str(tmp_path / "sync-decisions.yaml"),
                   "--benchmark-ref", str(tmp_path / "bench-0.33.0.json")])
    out = capsys.readouterr()
    assert rc == 1
    assert f"failed gate(s): {gate}" in out.err
    assert f"gate {gate}: FAIL" in out.out
    assert not pin_file.exists()


def _empty_patches(tmp_path: Path) -> Path:
    d = tmp_path / "empty_patches"
    d.mkdir(exist_ok=True)
    return d


@pytest.mark.parametrize("to", ["0.33", "v0.33", "vllm==0.33.0", " 0.33.0 "])
def test_pin_advance_reads_a_short_or_prefixed_version_as_the_release(tmp_path, gates_ok, to):
    """``--to 0.33`` is PEP 440's 0.33.0: every gate compares it as that release, and the record says 0.33.0
    (it used to fail every gate with "candidate is 0.33.0, not 0.33" and would have recorded "0.33")."""
    pre, anchors, q = gates_ok
    pin_file = tmp_path / PIN_FILE_NAME
    gates, rec = advance(to, preflight=pre, queue=q, anchors_dir=anchors, pin_path=pin_file, **_kw(tmp_path))
    assert all(g.ok for g in gates), gates
    assert rec is not None and rec.version == "0.33.0" and read_pin(pin_file) == rec


def test_pin_advance_refuses_a_preflight_for_another_candidate(tmp_path, gates_ok):
    pre, anchors, q = gates_ok
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "candidate": "0.34.0"}))
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, pin_path=tmp_path / "p.toml",
                         **_kw(tmp_path))
    assert rec is None and not gates[0].ok and "0.34.0" in gates[0].reason


def test_pin_advance_refuses_a_stale_manifest(tmp_path, gates_ok):
    from sndr.load import load_patch_set

    pre, anchors, q = gates_ok
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PN1", BLOCK_POOL, "        return ret\n")
    ps = load_patch_set(pdir)
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "patch_set": {"digest": ps.digest()}}))  # run on this set
    os.utime(pre, (1_000_000, 1_000_000))
    (anchors / "vllm-0.33.0.json").write_text(json.dumps({"patch_set_digest": "0" * 64}))
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, patch_set=ps,
                         pin_path=tmp_path / "p.toml", **_kw(tmp_path))
    assert rec is None and [g.name for g in gates if not g.ok] == ["manifest"]
    (anchors / "vllm-0.33.0.json").write_text(json.dumps({"patch_set_digest": ps.digest(), "tree_digest": "b" * 64}))
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, patch_set=ps,
                         pin_path=tmp_path / "p.toml", **_kw(tmp_path))
    assert rec is None and "built on tree bbbbbbbbbbbb" in gates[1].reason
    (anchors / "vllm-0.33.0.json").write_text(json.dumps({"patch_set_digest": ps.digest(), "tree_digest": "a" * 64}))
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, patch_set=ps,
                         pin_path=tmp_path / "p.toml", dry_run=True, **_kw(tmp_path))
    assert rec is not None and not (tmp_path / "p.toml").exists()


def test_pin_advance_to_a_sha_needs_a_version(tmp_path, gates_ok, scripted):
    pre, anchors, q = gates_ok
    repo, tree, c = scripted
    rep = plan_queue(repo.path, "pin", "main", SURFACE, _dir_tree(tree))  # gates_ok ported everything mechanical
    q.write_text(rep.model_dump_json())
    sha = rep.to_sha[:12]
    (anchors / f"vllm-{sha}.json").write_text("{}")
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "candidate": {"sha": rep.to_sha}}))
    os.utime(pre, (1_000_000, 1_000_000))
    with pytest.raises(SndrError) as exc:
        advance(sha, preflight=pre, queue=q, anchors_dir=anchors, pin_path=tmp_path / "p.toml", **_kw(tmp_path))
    assert exc.value.problems[0].code == "no_version"
    gates, rec = advance(sha, preflight=pre, queue=q, anchors_dir=anchors, pin_path=tmp_path / "p.toml",
                         version="0.33.0rc1.dev5", **_kw(tmp_path))
    assert rec.sha == sha and rec.version == "0.33.0rc1.dev5"
    assert sndr_main(["pin", "show", "--pin-file", str(tmp_path / "p.toml")]) == 0


def test_pin_show_without_a_record_names_the_pin_in_force(tmp_path, capsys):
    """A patch dir without _pin.toml is validated on sndr's own pin (manifest, apply): `pin show` said only
    "no pin recorded" and exited 1, while every other command said "the pinned vLLM 0.32.0"."""
    from sndr import PIN_VERSION
    from sndr.pinrecord import pin_version

    patches = tmp_path / "patches"
    patches.mkdir()
    assert pin_version(patches) == (PIN_VERSION, None)
    assert sndr_main(["pin", "show", "--patches", str(patches)]) == 0
    out = capsys.readouterr().out
    assert "no pin recorded" in out and f"the pin is sndr's own, vllm {PIN_VERSION}" in out, out
    (patches / "_pin.toml").write_text('version = "0.33.0"\n')
    version, rec = pin_version(patches)
    assert version == "0.33.0" and rec is not None and rec.version == "0.33.0"
    assert sndr_main(["pin", "show", "--patches", str(patches)]) == 0
    assert "version=0.33.0" in capsys.readouterr().out


def test_pin_advance_refuses_a_same_version_preflight(tmp_path, gates_ok, capsys):
    """A preflight of two builds of one vLLM version (its warnings carry same_version: pin 0.33.0, candidate
    0.33.0 with other files) passed the preflight gate and advanced the pin, though it compares no bump. Now
    refused, not_a_bump (exit 2), and no pin record is written; without the warning the same report passes."""
    pre, anchors, q = gates_ok
    warning = {"code": "same_version", "message": "the pin (a) and the candidate (b) are both vLLM 0.33.0, with "
               "other files", "key": "--candidate"}
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "pin": "0.33.0", "warnings": [warning]}))
    os.utime(pre, (1_000_000, 1_000_000))
    pin_file = tmp_path / PIN_FILE_NAME
    with pytest.raises(SndrError) as ei:
        advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, pin_path=pin_file, **_kw(tmp_path))
    assert ei.value.problems[0].code == "not_a_bump" and "two builds of one vLLM version" in str(ei.value)
    assert not pin_file.exists()
    assert sndr_main(["pin", "advance", "--to", "0.33.0", "--preflight", str(pre), "--no-benchmark-ref", "t",
                      "--dry-run"]) == 2
    assert "(not_a_bump)" in capsys.readouterr().err
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "pin": "0.33.0", "warnings": []}))
    os.utime(pre, (1_000_000, 1_000_000))
    gates, rec = advance("0.33.0", preflight=pre, queue=q, anchors_dir=anchors, pin_path=pin_file, **_kw(tmp_path))
    assert rec is not None and gates[0].ok
