"""``sndr vendor``: unified diff -> patch file, checked by planning it.

The strongest test is the real-data round trip: every .py file that differs
between vLLM 0.32.0 and 0.33.0 is turned into a difflib diff, vendored
against 0.32.0, and the result must rebuild 0.33.0 byte for byte and read
``applied``/``merged`` on 0.33.0. CI runs a seeded sample; ``--slow`` and
``benchmarks/bench_vendor_roundtrip.py`` run all of them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sndr.__main__ import main as sndr_main
from sndr.classify import classify_edit
from sndr.load import PatchSet, load_patch_file, parse_patch
from sndr.model import Patch, Verdict
from sndr.plan import build_plan
from sndr.tomlwrite import dumps_patch, toml_multiline, toml_string
from sndr.upstream.vendor import (
    parse_diff,
    roundtrip_file,
    split_lines,
    unified_diff,
    vendor_diff,
)

SAMPLE_SIZE = 120
SEED = 20240601


# ----------------------------------------------------------------------------- helpers


def reader(files: dict[str, str]):
    return lambda rel: files.get(rel)


def plan_texts(patch: Patch, files: dict[str, str | None]) -> dict[str, str]:
    plan = build_plan(PatchSet(patches=[patch]), reader(files), "0.32.0", environ={}, check_compile=False)
    assert not plan.problems, [p.render() for p in plan.problems]
    return {rel: ch.new for rel, ch in plan.changes.items()}


def verdicts_on(patch: Patch, files: dict[str, str]) -> dict[str, Verdict]:
    plan = build_plan(PatchSet(patches=[patch]), reader(files), "0.32.0", environ={}, check_compile=False)
    return {e.name: e.verdict for r in plan.patches for e in r.edits}


def mail(subject: str, body: str, diffs: list[str]) -> str:
    """A ``git format-patch`` mail around some per-file diffs."""
    stat = "".join(f" {d.split(' b/', 1)[1].split(chr(10), 1)[0]} | 2 +-\n" for d in diffs)
    return (
        "From 1f2e3d4c5b6a79880000000000000000000000ff Mon Sep 17 00:00:00 2001\n"
        "From: A Developer <dev@example.com>\n"
        "Date: Tue, 4 Jun 2024 10:00:00 +0200\n"
        f"Subject: [PATCH] {subject}\n"
        "\n"
        f"{body}\n"
        "---\n"
        f"{stat}"
        f" {len(diffs)} files changed\n"
        "\n"
        + "".join(diffs)
        + "-- \n2.39.5\n\n"
    )


SCHED = """\
import logging

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config):
        self.config = config
        self.waiting = []
        self.running = []

    def schedule(self):
        budget = self.config.max_num_batched_tokens
        out = []
        for req in self.waiting:
            if req.num_tokens > budget:
                break
            budget -= req.num_tokens
            out.append(req)
        return out

    def finish(self, req):
        self.running.remove(req)
        return req
"""

SCHED_NEW = """\
import logging

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config):
        self.config = config
        self.waiting = []
        self.running = []
        self.max_hit_clamp = config.max_model_len

    def schedule(self):
        budget = self.config.max_num_batched_tokens
        out = []
        for req in self.waiting:
            if req.num_tokens > budget or req.num_tokens > self.max_hit_clamp:
                break
            budget -= req.num_tokens
            out.append(req)
        return out

    def finish(self, req):
        self.running.remove(req)
        return req
"""

UTILS = """\
def block_hash(tokens):
    return hash(tuple(tokens))


def free_blocks(pool, n):
    return pool[:n]
"""

UTILS_NEW = """\
def block_hash(tokens, extra=None):
    return hash((tuple(tokens), extra))


def free_blocks(pool, n):
    return pool[:n]
"""

NEWMOD = """\
\"\"\"Clamp helpers (new upstream).\"\"\"


def clamp_hit_length(hit_length: int, max_hit: int) -> int:
    return min(hit_length, max_hit)
"""

PIN_FILES = {"vllm/v1/core/sched/scheduler.py": SCHED, "vllm/v1/core/kv_cache_utils.py": UTILS}


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode())
    info = root / "vllm-0.32.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n\n")
    return root


def series_diff() -> str:
    return mail(
        "[Core] Clamp the hit length to the model length (#45614)",
        "The hit length could exceed max_model_len after a preemption.\n\nSigned-off-by: A Developer",
        [
            unified_diff(SCHED, SCHED_NEW, "vllm/v1/core/sched/scheduler.py"),
            unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"),
            unified_diff(None, NEWMOD, "vllm/v1/core/clamp.py"),
            unified_diff(None, "def test_clamp():\n    pass\n", "tests/v1/core/test_clamp.py"),
        ],
    )


# ----------------------------------------------------------------------------- text helpers


def test_split_lines_splits_on_newline_only():
    text = "a\x0cb\n\rc\u2028d\r\ne"
    assert split_lines(text) == ["a\x0cb\n", "\rc\u2028d\r\n", "e"]
    assert "".join(split_lines(text)) == text
    assert split_lines("") == [] and split_lines("\n") == ["\n"]


@pytest.mark.parametrize("old,new", [
    ("a\nb\nc", "a\nB\nc"),          # neither ends with a newline
    ("a\nb\nc\n", "a\nb\nc"),        # the change removes the final newline
    ("a\nb\nc", "a\nb\nc\n"),        # the change adds it
    ("x = 1\ny = 2", "x = 1\ny = 2\nz = 3"),
])
def test_no_newline_at_end_of_file(old, new):
    diff = unified_diff(old, new, "vllm/m.py")
    assert "\\ No newline at end of file" in diff
    files, _ = parse_diff(diff)
    assert "".join(files[0].hunks[0].post).endswith(new[-1])
    assert roundtrip_file("vllm/m.py", old, new) == ("ok", "")


def test_crlf_and_form_feed_files_round_trip():
    old = "import os\r\n\x0c\r\ndef f():\r\n    return 1\r\n"
    new = "import os\r\n\x0c\r\ndef f():\r\n    return 2  # fixed\r\n"
    assert roundtrip_file("vllm/m.py", old, new) == ("ok", "")


# ----------------------------------------------------------------------------- diffs with several files


def test_format_patch_with_several_files_and_a_new_file(tmp_path, capsys):
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "0001-clamp.patch"
    diff.write_text(series_diff())
    out = tmp_path / "patches"
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0101", "--tree", str(tree), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    written = sorted(out.glob("*.toml"))
    assert [p.name for p in written] == ["PN0101-clamp-the-hit-length-to-the-model-length.toml"]
    patch = load_patch_file(written[0])
    # Title and upstream reference come from the mail; the body becomes the description.
    assert patch.title == "[Core] Clamp the hit length to the model length (#45614)"
    assert patch.upstream == ["vllm#45614"]
    assert "max_model_len after a preemption" in patch.description
    assert [f.path for f in patch.files] == ["vllm/v1/core/sched/scheduler.py", "vllm/v1/core/kv_cache_utils.py",
                                             "vllm/v1/core/clamp.py"]
    assert patch.files[2].create == NEWMOD and not patch.files[2].edits
    assert "skipped tests/v1/core/test_clamp.py: outside vllm/" in err
    # Applying it to the pin gives exactly the new files.
    got = plan_texts(patch, dict(PIN_FILES))
    assert got == {"vllm/v1/core/sched/scheduler.py": SCHED_NEW, "vllm/v1/core/kv_cache_utils.py": UTILS_NEW,
                   "vllm/v1/core/clamp.py": NEWMOD}
    # And on the post-image every edit reads applied or merged.
    v = verdicts_on(patch, {**got})
    assert v and set(v.values()) <= {Verdict.APPLIED, Verdict.MERGED}


def test_real_git_format_patch(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    make_tree(repo, PIN_FILES)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    (repo / "vllm/v1/core/sched/scheduler.py").write_text(SCHED_NEW)
    (repo / "vllm/v1/core/clamp.py").write_text(NEWMOD)
    git("add", "-A")
    git("commit", "-qm", "Clamp hit length (#777)")
    (repo / "vllm/v1/core/kv_cache_utils.py").write_text(UTILS_NEW)
    (repo / "vllm/v1/core/sched/scheduler.py").write_text(SCHED_NEW.replace("return req\n", "return req  # done\n"))
    git("commit", "-qam", "Hash extras")
    series = git("format-patch", "--stdout", "HEAD~2")
    res = vendor_diff(series, reader(PIN_FILES), patch_id="PN0102")
    assert res.ok, [p.render() for p in res.problems]
    assert res.patch.title == "Clamp hit length (#777)" and res.patch.upstream == ["vllm#777"]
    want = {"vllm/v1/core/sched/scheduler.py": (repo / "vllm/v1/core/sched/scheduler.py").read_text(),
            "vllm/v1/core/kv_cache_utils.py": UTILS_NEW, "vllm/v1/core/clamp.py": NEWMOD}
    assert plan_texts(res.patch, dict(PIN_FILES)) == want
    # git diff (no mail) of the same range: needs --title.
    plain = git("diff", "HEAD~2", "HEAD")
    res2 = vendor_diff(plain, reader(PIN_FILES), patch_id="PN0103", title="same change")
    assert res2.ok and plan_texts(res2.patch, dict(PIN_FILES)) == want
    assert vendor_diff(plain, reader(PIN_FILES), patch_id="PN0103").problems[0].code == "no_title"


def test_plain_diff_u_paths_are_resolved(tmp_path):
    old, new = tmp_path / "a" / "vllm" / "x.py", tmp_path / "b" / "vllm" / "x.py"
    for p, t in ((old, UTILS), (new, UTILS_NEW)):
        p.parent.mkdir(parents=True)
        p.write_text(t)
    proc = subprocess.run(["diff", "-u", str(old), str(new)], capture_output=True, text=True)
    assert proc.returncode == 1
    res = vendor_diff(proc.stdout, reader({"vllm/x.py": UTILS}), patch_id="PN0104", title="t")
    assert res.ok, [p.render() for p in res.problems]
    assert res.patch.files[0].path == "vllm/x.py"


def test_deleted_file_is_refused(tmp_path, capsys):
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "del.patch"
    diff.write_text(unified_diff(SCHED, SCHED_NEW, "vllm/v1/core/sched/scheduler.py")
                    + unified_diff(UTILS, None, "vllm/v1/core/kv_cache_utils.py"))
    out = tmp_path / "patches"
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0105", "--title", "t", "--tree", str(tree), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2  # deleted_file is bad input (schema codes), as every vendor refusal
    assert "refused: vllm/v1/core/kv_cache_utils.py: deleted file refused" in err
    assert "never deletes" in err and "nothing written" in err
    assert not out.exists()


def test_a_new_binary_file_is_refused_by_its_own_name_and_skips_carry_codes(tmp_path, capsys):
    """The new-user review (stop 44): git's diff of a new binary file kept its b/ prefix, so vendor skipped
    `b/vllm/newbin.dat` as "outside vllm/" and, next to text changes, said ok without it. And each skip now
    carries a reason code in --json."""
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "bin.patch"
    diff.write_text(unified_diff(SCHED, SCHED_NEW, "vllm/v1/core/sched/scheduler.py")
                    + "diff --git a/vllm/newbin.dat b/vllm/newbin.dat\nnew file mode 100644\nindex 0000000..1111111\n"
                    "Binary files /dev/null and b/vllm/newbin.dat differ\n"
                    + unified_diff("x = 1\n", "x = 2\n", "docs/notes.py"))
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0106", "--title", "t", "--tree", str(tree),
                    "--out", str(tmp_path / "patches"), "--json", "-"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 2 and [(p["code"], p["file"]) for p in data["problems"]] == [("binary_file", "vllm/newbin.dat")]
    assert data["skipped"] == [{"file": "docs/notes.py", "code": "outside_package",
                                "reason": "outside vllm/ (not part of an installed vLLM; tests and docs are not "
                                          "shipped)"}]


def test_renamed_file_is_refused():
    diff = ("diff --git a/vllm/old.py b/vllm/new.py\nsimilarity index 100%\n"
            "rename from vllm/old.py\nrename to vllm/new.py\n")
    res = vendor_diff(diff, reader({"vllm/old.py": "x = 1\n"}), patch_id="PN0106", title="t")
    assert not res.ok and res.problems[0].code == "renamed_file"


# ----------------------------------------------------------------------------- hunks: placing, widening, refusing


def test_hunk_that_cannot_be_made_unique_is_refused(tmp_path, capsys):
    block = "x = compute()\ny = x + 1\nprint(y)\n\n"
    text = "import os\n\n" + block * 7
    # A change in the middle of seven identical blocks: unique only with more context than allowed.
    lines = split_lines(text)
    k = 2 + 3 * 4 + 1
    assert lines[k] == "y = x + 1\n"
    new = "".join(lines[:k] + ["y = x + 2\n"] + lines[k + 1:])
    tree = make_tree(tmp_path / "site", {"vllm/rep.py": text})
    diff = tmp_path / "rep.patch"
    diff.write_text(unified_diff(text, new, "vllm/rep.py"))
    out = tmp_path / "patches"
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0107", "--title", "t", "--tree", str(tree), "--out", str(out),
                   "--max-context", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()  # hunk_not_found: bad input (schema codes)
    assert "vllm/rep.py" in err and "hunk 1 (@@ -" in err and "cannot be made unique" in err
    # With room to widen, the same hunk vendors (and says it was widened).
    res = vendor_diff(diff.read_text(), reader({"vllm/rep.py": text}), patch_id="PN0107", title="t")
    assert res.ok and res.edits[0].widened
    assert plan_texts(res.patch, {"vllm/rep.py": text}) == {"vllm/rep.py": new}


def test_widened_hunks_are_reported():
    # The diff's own 3 lines of context are not unique; the anchor must grow.
    body = "".join(f"    v{i} = {i}\n" for i in range(9))
    text = f"def f():\n{body}    return v1\n\n\ndef g():\n{body}    return v2\n"
    new = text.replace(body + "    return v2", body.replace("v4 = 4", "v4 = 40") + "    return v2")
    res = vendor_diff(unified_diff(text, new, "vllm/w.py"), reader({"vllm/w.py": text}), patch_id="PN0108", title="t")
    assert res.ok
    (e,) = res.edits
    assert e.widened and (e.widened_before or e.widened_after)
    assert e.name == "g"
    assert res.patch.files[0].edits[0].anchor.startswith("def g():\n")  # the nearest line that tells f and g apart
    assert (e.widened_before, e.context_before) == (2, 5)
    assert "widened" in res.text  # the TOML comment says so too
    assert plan_texts(res.patch, {"vllm/w.py": text}) == {"vllm/w.py": new}


def test_minimal_anchor_when_the_changed_line_is_unique():
    res = vendor_diff(unified_diff(UTILS, UTILS_NEW, "vllm/u.py"), reader({"vllm/u.py": UTILS}),
                      patch_id="PN0109", title="t")
    (edit,) = res.patch.files[0].edits
    assert edit.anchor == "def block_hash(tokens):\n    return hash(tuple(tokens))\n"
    assert not res.edits[0].widened and res.edits[0].context_before == 0


def test_hunks_are_placed_sequentially():
    # Hunk 1 adds a copy of the line hunk 2 changes: in the pin that line is
    # unique, but in the text hunk 1 leaves it is not, which is where the
    # planner looks for hunk 2's anchor.
    filler = "".join(f"v{i} = {i}\n" for i in range(12))
    old = f"import os\n{filler}limit = compute_limit(cfg)\n{filler}"
    new = old.replace("import os\n", "import os\nlimit = compute_limit(cfg)\n").replace(
        f"{filler}limit = compute_limit(cfg)\n", f"{filler}limit = compute_limit(cfg, strict=True)\n")
    diff = unified_diff(old, new, "vllm/s.py")
    assert diff.count("@@ -") == 2
    res = vendor_diff(diff, reader({"vllm/s.py": old}), patch_id="PN0110", title="t")
    assert res.ok, [p.render() for p in res.problems]
    second = res.patch.files[0].edits[1]
    assert second.anchor != "limit = compute_limit(cfg)\n"  # widened within the text hunk 1 left
    assert plan_texts(res.patch, {"vllm/s.py": old}) == {"vllm/s.py": new}


def test_diff_against_another_base_is_placed_with_offset_and_fuzz():
    base = UTILS + "\n\ndef tail():\n    return 0\n"
    new = base.replace("    return 0\n", "    return 1\n")
    diff = unified_diff(base, new, "vllm/u.py")
    pin = "# a pin-only header line\n# and another\n" + base.replace("def free_blocks(pool, n):",
                                                                      "def free_blocks(pool, n):  # pin")
    res = vendor_diff(diff, reader({"vllm/u.py": pin}), patch_id="PN0111", title="t")
    assert res.ok, [p.render() for p in res.problems]
    assert res.edits[0].offset == 2
    assert any("placed +2 lines" in w for w in res.warnings)
    want = pin.replace("    return 0\n", "    return 1\n")
    assert plan_texts(res.patch, {"vllm/u.py": pin}) == {"vllm/u.py": want}
    # A pre-image that is not there at all is refused, naming the hunk.
    res = vendor_diff(diff, reader({"vllm/u.py": UTILS}), patch_id="PN0111", title="t")
    assert not res.ok and res.problems[0].code == "hunk_not_found" and "hunk 1" in res.problems[0].message


def test_pure_deletion_gets_a_non_empty_replacement():
    old = "a = 1\nb = 2\nremove_me()\nc = 3\n"
    new = "a = 1\nb = 2\nc = 3\n"
    res = vendor_diff(unified_diff(old, new, "vllm/d.py"), reader({"vllm/d.py": old}), patch_id="PN0112", title="t")
    assert res.ok
    (edit,) = res.patch.files[0].edits
    assert edit.replacement and edit.replacement.strip()
    assert edit.merged_markers == []
    assert any("only deletes lines" in w for w in res.warnings)
    assert plan_texts(res.patch, {"vllm/d.py": old}) == {"vllm/d.py": new}
    assert verdicts_on(res.patch, {"vllm/d.py": new}) == {edit.name: Verdict.APPLIED}


# ----------------------------------------------------------------------------- merged markers


def test_marker_is_absent_from_the_pin_and_present_after():
    res = vendor_diff(unified_diff(SCHED, SCHED_NEW, "vllm/s.py"), reader({"vllm/s.py": SCHED}),
                      patch_id="PN0113", title="t")
    assert res.ok
    for edit in res.patch.files[0].edits:
        (m,) = edit.merged_markers
        assert m not in SCHED and m in SCHED_NEW
    # Both added lines bring in the new name; the shorter one wins.
    assert [e.merged_markers for e in res.patch.files[0].edits] == [["self.max_hit_clamp = config.max_model_len"]]
    assert all(r.marker_source == "auto" for r in res.edits)


def test_marker_prefers_code_over_comments_and_blank_lines():
    old = "def f(x):\n    return x\n"
    new = "def f(x):\n\n    # clamp negative inputs to zero\n    x = max(x, 0)\n    return x\n"
    res = vendor_diff(unified_diff(old, new, "vllm/m.py"), reader({"vllm/m.py": old}), patch_id="PN0114", title="t")
    assert res.patch.files[0].edits[0].merged_markers == ["x = max(x, 0)"]


def test_marker_falls_back_to_a_pair_of_lines():
    # Each added line exists in the pin on its own; the pair does not.
    old = "def f(a, b):\n    if a:\n        return b\n    return a\n\n\ndef g(b):\n    return b\n"
    new = old.replace("def g(b):\n    return b\n", "def g(b):\n    if a:\n        return b\n    return b\n")
    res = vendor_diff(unified_diff(old, new, "vllm/p.py"), reader({"vllm/p.py": old}), patch_id="PN0115", title="t")
    (m,) = res.patch.files[0].edits[0].merged_markers
    assert "\n" in m and m not in old and m in new


def test_no_marker_is_invented_when_every_added_line_exists(tmp_path, capsys):
    # The added line exists in the pin, and so does every pair it forms.
    old = "def g():\n    return x\n    return x\n\n\ndef f():\n    return x\n"
    new = old + "    return x\n"
    tree = make_tree(tmp_path / "site", {"vllm/n.py": old})
    diff = tmp_path / "n.patch"
    diff.write_text(unified_diff(old, new, "vllm/n.py"))
    out = tmp_path / "p"
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0116", "--title", "t", "--tree", str(tree), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0
    assert "no merged marker" in err and "none was invented" in err and "--marker f=TEXT" in err
    (patch_file,) = out.glob("*.toml")
    assert load_patch_file(patch_file).files[0].edits[0].merged_markers == []
    # The author passes one: by edit name, or by hunk number.
    for key in ("f", "1"):
        res = vendor_diff(diff.read_text(), reader({"vllm/n.py": old}), patch_id="PN0116", title="t",
                          markers={key: ["def f():\n    return x\n    return x"]})
        assert res.ok and res.patch.files[0].edits[0].merged_markers == ["def f():\n    return x\n    return x"]
        assert res.edits[0].marker_source == "--marker"
    # A marker already in the pin would read as merged there: refused, exit 2.
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0117", "--title", "t", "--tree", str(tree), "--out", str(out),
                   "--marker", "f=return x"])
    assert rc == 2 and "already in the pin's file" in capsys.readouterr().err
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0117", "--title", "t", "--tree", str(tree), "--out", str(out),
                   "--marker", "nosuch=abc"])
    assert rc == 2 and "no edit of this patch" in capsys.readouterr().err


# ----------------------------------------------------------------------------- creates and odd files


def test_new_file_becomes_a_create_entry():
    res = vendor_diff(unified_diff(None, NEWMOD, "vllm/c.py"), reader({}), patch_id="PN0118", title="t")
    assert res.ok and res.created == ["vllm/c.py"]
    assert res.patch.files[0].create == NEWMOD
    assert "create = '''" in res.text
    assert plan_texts(res.patch, {}) == {"vllm/c.py": NEWMOD}
    assert verdicts_on(res.patch, {"vllm/c.py": NEWMOD}) == {"create": Verdict.MERGED}


def test_creating_an_existing_or_empty_file_is_refused():
    diff = unified_diff(None, NEWMOD, "vllm/c.py")
    res = vendor_diff(diff, reader({"vllm/c.py": "old\n"}), patch_id="PN0119", title="t")
    assert res.problems[0].code == "create_exists"
    empty = "diff --git a/vllm/e.py b/vllm/e.py\nnew file mode 100644\nindex 0000000..e69de29\n"
    res = vendor_diff(empty, reader({}), patch_id="PN0119", title="t")
    assert not res.ok  # no hunks: nothing to create (an empty file cannot be a create entry)


def test_cli_stdout_and_overwrite(tmp_path, capsys):
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"))
    base = ["--diff", str(diff), "--id", "PN0120", "--title", "Hash extras", "--tree", str(tree)]
    assert sndr_main(["vendor", *(base + ["--stdout", "--upstream", "vllm#1"])]) == 0
    text = capsys.readouterr().out
    assert parse_patch(text, "stdout").upstream == ["vllm#1"]
    target = tmp_path / "out" / "x.toml"
    assert sndr_main(["vendor", *(base + ["--out", str(target)])]) == 0
    assert sndr_main(["vendor", *(base + ["--out", str(target)])]) == 2
    assert "already exists" in capsys.readouterr().err
    assert sndr_main(["vendor", *(base + ["--out", str(target), "--force"])]) == 0
    assert sndr_main(["vendor", "--diff", str(tmp_path / "missing.patch"), "--id", "PN1", "--title", "t",
                     "--tree", str(tree)]) == 2
    assert sndr_main(["vendor", "--diff", str(diff), "--id", "9bad", "--title", "t", "--tree", str(tree), "--stdout"]) == 2


def test_out_defaults_to_the_patch_set_in_effect_never_the_working_directory(tmp_path, monkeypatch, capsys):
    """The audit's new-user pass: without --out, vendor wrote ./patches/<ID>-<slug>.toml under whatever
    directory it ran in. The default is the patch set in effect, as for every command that writes into
    one ($SNDR_PATCHES, else the shipped set of a checkout), never an installed sndr's shipped data
    (shipped_data_write, exit 2, naming --out), never the working directory unasked."""
    import sndr.env as env

    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"))
    argv = ["vendor", "--diff", str(diff), "--id", "PN0120", "--title", "Hash extras", "--tree", str(tree)]
    cwd, mine = tmp_path / "cwd", tmp_path / "mine"
    cwd.mkdir()
    mine.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(env.PATCHES, str(mine))
    assert sndr_main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["PN0120-hash-extras.toml"] and not list(cwd.iterdir())
    assert f"wrote {mine / 'PN0120-hash-extras.toml'}" in capsys.readouterr().err
    # an installed sndr, no $SNDR_PATCHES: the set in effect is the shipped data, which a reinstall replaces
    pkg = tmp_path / "venv" / "lib" / "site-packages" / "sndr"
    data = pkg / "_data" / "patches"
    data.mkdir(parents=True)
    monkeypatch.setattr(env, "_package_dir", lambda: pkg)
    monkeypatch.delenv(env.PATCHES)
    for extra in ([], ["--out", str(data)]):
        assert sndr_main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert "shipped_data_write" in err and "--out DIR" in err, err
        assert not list(cwd.iterdir()) and not list(data.iterdir())
    assert sndr_main([*argv, "--out", str(cwd / "here")]) == 0  # asked for: fine
    assert [p.name for p in (cwd / "here").iterdir()] == ["PN0120-hash-extras.toml"]


def test_cli_stdout_and_json_dash_are_refused_together(tmp_path, capsys):
    """--stdout prints the patch file and --json - the report: both on stdout was a TOML text followed by a
    JSON document that no reader could parse. Refused (stdout_conflict, exit 2) with one JSON document."""
    import json

    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"))
    argv = ["vendor", "--diff", str(diff), "--id", "PN0121", "--title", "t", "--tree", str(tree), "--stdout"]
    assert sndr_main([*argv, "--json", "-"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["problems"][0]["code"] == "stdout_conflict" and "stdout_conflict" in err
    assert sndr_main([*argv, "--json", str(tmp_path / "r.json")]) == 0  # the report to a file: fine
    assert parse_patch(capsys.readouterr().out, "stdout").id == "PN0121"
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_dispatcher_maps_vendor(tmp_path, capsys):
    # in process through the one entry (the parser, the boundary, the exit status): a child cost ~0.3 s
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"))
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0121", "--title", "t", "--tree", str(tree), "--stdout"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert parse_patch(out, "out").id == "PN0121"


# ----------------------------------------------------------------------------- the TOML writer


def test_written_toml_parses_back_to_the_same_edits():
    res = vendor_diff(series_diff(), reader(PIN_FILES), patch_id="PN0122")
    back = parse_patch(res.text, "PN0122.toml")
    assert back == res.patch
    assert [(e.name, e.anchor, e.replacement, e.merged_markers) for _, e in back.edits()] == \
           [(e.name, e.anchor, e.replacement, e.merged_markers) for _, e in res.patch.edits()]
    assert "anchor = '''\n" in res.text  # literal strings for code


def test_code_that_literal_strings_cannot_hold_falls_back_to_escapes():
    old = "S = '''doc'''\nT = 'a\\x0cb'\nF = 1\n"
    new = "S = '''doc2'''\nT = 'a\\x0cb'\nF = 1\n\x0c\nG = 'it'\n"
    res = vendor_diff(unified_diff(old, new, "vllm/q.py"), reader({"vllm/q.py": old}), patch_id="PN0123", title="t")
    assert res.ok
    assert '"""' in res.text
    assert parse_patch(res.text, "q.toml") == res.patch
    assert plan_texts(res.patch, {"vllm/q.py": old}) == {"vllm/q.py": new}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60))
def test_toml_strings_hold_any_text(s):
    doc = f"a = {toml_string(s)}\nb = {toml_multiline(s)}\n"
    data = tomllib.loads(doc)
    assert data == {"a": s, "b": s}


def test_dumps_patch_writes_every_model_field():
    p = Patch.model_validate({
        "id": "PN0124", "title": "t", "lifecycle": "experimental", "default": False, "vllm": ">=0.32,<0.34",
        "requires": ["PN0001"], "merged_markers": ["m"], "description": "why\nbecause",
        "groups": {"anchor_variants": "one_of"},
        "files": [{"path": "vllm/a.py", "merged_markers": ["fm"], "edits": [
            {"name": "a1", "anchor": "x\n", "replacement": "y\n", "group": "anchor_variants", "required": False},
            {"name": "a2", "anchor": "x2\n", "replacement": "y2\n", "group": "anchor_variants"}]}],
    })
    text = dumps_patch(p, header="Why: a test.", comments={"a1": "first variant"})
    assert text.startswith("# Why: a test.\n") and "# first variant\n[[files.edits]]" in text
    assert parse_patch(text, "x.toml") == p


# ----------------------------------------------------------------------------- real data: 0.32.0 -> 0.33.0


def _changed_files(pin: Path, cand: Path) -> tuple[list[str], list[str]]:
    a = {p.relative_to(pin).as_posix() for p in (pin / "vllm").rglob("*.py")}
    b = {p.relative_to(cand).as_posix() for p in (cand / "vllm").rglob("*.py")}
    modified = sorted(r for r in a & b if (pin / r).read_bytes() != (cand / r).read_bytes())
    return modified, sorted(b - a)


def _check_real(rel: str, pin: Path, cand: Path) -> None:
    old = (pin / rel).read_bytes().decode() if (pin / rel).exists() else None
    new = (cand / rel).read_bytes().decode()
    status, why = roundtrip_file(rel, old, new, version="0.32.0")
    assert status == "ok", f"{rel}: {status}: {why}"


def test_real_round_trip_sample(vllm_pin_root, vllm_candidate_root):
    modified, added = _changed_files(vllm_pin_root, vllm_candidate_root)
    assert len(modified) > 800
    rng = random.Random(SEED)
    sample = rng.sample(modified, SAMPLE_SIZE) + rng.sample(added, 10)
    # The largest diffs are where widening and sequencing get hard: always include a few.
    sample += sorted(modified, key=lambda r: -(vllm_candidate_root / r).stat().st_size)[:5]
    for rel in sample:
        _check_real(rel, vllm_pin_root, vllm_candidate_root)


def test_real_round_trip_checks_independently(vllm_pin_root, vllm_candidate_root):
    """The round trip's own checks, spelled out on one real file without roundtrip_file."""
    rel = "vllm/v1/core/sched/scheduler.py"
    old = (vllm_pin_root / rel).read_text()
    new = (vllm_candidate_root / rel).read_text()
    res = vendor_diff(unified_diff(old, new, rel), reader({rel: old}), patch_id="RT0002", title="t")
    assert res.ok
    patch = parse_patch(res.text, "rt.toml")
    assert len(patch.files[0].edits) >= 10
    assert plan_texts(patch, {rel: old}) == {rel: new}
    assert set(verdicts_on(patch, {rel: new}).values()) <= {Verdict.APPLIED, Verdict.MERGED}
    for edit in patch.files[0].edits:
        for m in edit.merged_markers:
            assert m not in old and m in new
        # Every edit recognises itself by its replacement once applied, markers aside.
        bare = edit.model_copy(update={"merged_markers": []})
        assert classify_edit(bare, new, new).verdict == Verdict.APPLIED


@pytest.mark.slow
def test_real_round_trip_full_corpus(vllm_pin_root, vllm_candidate_root):
    modified, added = _changed_files(vllm_pin_root, vllm_candidate_root)
    for rel in modified + added:
        _check_real(rel, vllm_pin_root, vllm_candidate_root)


def test_zero_context_diffs_are_placed_by_their_headers():
    old = "".join(f"line_{i} = {i}\n" for i in range(30))
    new = old.replace("line_3 = 3\n", "").replace("line_10 = 10\n", "line_10 = 10\nadded_here = True\n")
    new = "header_line = 0\n" + new
    diff = unified_diff(old, new, "vllm/z.py", context=0)
    assert "@@ -0,0 +1 @@" in diff
    top_only = unified_diff(old, "header_line = 0\n" + old, "vllm/z.py", context=0)
    assert top_only.count("@@ -") == 1  # one "@@ -0,0" hunk: a modification, not a new file
    res = vendor_diff(top_only, reader({"vllm/z.py": old}), patch_id="PN0125", title="t")
    assert res.ok and res.created == []
    assert roundtrip_file("vllm/z.py", old, new) == ("ok", "")
    res = vendor_diff(diff, reader({"vllm/z.py": old}), patch_id="PN0125", title="t")
    assert res.ok and plan_texts(res.patch, {"vllm/z.py": old}) == {"vllm/z.py": new}


_LINES = st.sampled_from(["a\n", "b\n", "\n", "    x = 1\n", "def f():\n", "    return x\n", "c = 2\n", "# note\n"])


@settings(max_examples=150, deadline=None)
@given(old=st.lists(_LINES, min_size=1, max_size=25), data=st.data())
def test_vendor_is_never_wrong_on_repetitive_text(old, data):
    """On text made of a handful of repeated lines, vendor may refuse, but what it writes is exact."""
    new = list(old)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(new)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert" or not new or i == len(new):
            new.insert(i, data.draw(_LINES))
        elif op == "delete":
            del new[i]
        else:
            new[i] = data.draw(_LINES)
    if data.draw(st.booleans()) and new and new[-1].endswith("\n"):
        new[-1] = new[-1][:-1] or "z"
    old_text, new_text = "".join(old), "".join(new)
    if old_text == new_text:
        return
    status, why = roundtrip_file("vllm/r.py", old_text, new_text, max_context=6)
    assert status in ("ok", "refused"), why
    if status == "refused":
        assert why.startswith(("anchor_not_unique", "file_emptied")), why


def test_bad_inputs_are_exit_2():
    diff = unified_diff(UTILS, UTILS_NEW, "vllm/u.py")
    r = reader({"vllm/u.py": UTILS})
    assert vendor_diff("not a diff\n", r, patch_id="PN1", title="t").problems[0].code == "bad_diff"
    res = vendor_diff(diff, r, patch_id="PN1", title="t", vllm_spec=">=0.33", version="0.32.0")
    assert res.exit_code == 2 and "excludes the pin's version" in res.problems[0].message
    assert vendor_diff(diff, r, patch_id="PN1", title="t", vllm_spec="~~1").exit_code == 2
    res = vendor_diff(diff, r, patch_id="PN1", title="", upstream=["vllm#5"])
    assert res.exit_code == 2 and res.problems[0].code == "no_title"
    res = vendor_diff(diff, r, patch_id="PN1", title="t", vllm_spec=">=0.32,<0.34", version="0.32.0")
    assert res.ok and res.patch.vllm == ">=0.32,<0.34"


def test_include_exclude_and_json_report(tmp_path, capsys):
    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "s.patch"
    diff.write_text(series_diff())
    report = tmp_path / "r.json"
    rc = sndr_main(["vendor", "--diff", str(diff), "--id", "PN0126", "--tree", str(tree), "--stdout", "--json", str(report),
                   "--exclude", "vllm/v1/core/kv_cache_utils.py", "--exclude", "vllm/v1/core/clamp.py"])
    out = capsys.readouterr().out
    assert rc == 0
    assert [f.path for f in parse_patch(out, "o").files] == ["vllm/v1/core/sched/scheduler.py"]
    import json

    data = json.loads(report.read_text())
    assert data["ok"] and data["edits"][0]["name"] == "Scheduler"  # one hunk spanning two methods
    assert any(s["code"] == "excluded" and "excluded by --exclude" in s["reason"] for s in data["skipped"])
    res = vendor_diff(series_diff(), reader(PIN_FILES), patch_id="PN0127", include=["vllm/v1/core/clamp.py"])
    assert res.created == ["vllm/v1/core/clamp.py"] and len(res.patch.files) == 1


def test_a_diff_naming_no_files_names_the_diff_file(tmp_path, capsys):
    """Bad input names its file: an empty or non-diff --diff said only "[--diff]: the diff names no files"."""
    import json

    tree = make_tree(tmp_path / "pin", PIN_FILES)
    empty = tmp_path / "empty.patch"
    empty.write_text("not a diff\n")
    argv = ["vendor", "--diff", str(empty), "--id", "PX0001", "--title", "t", "--tree", str(tree),
            "--out", str(tmp_path / "out")]
    assert sndr_main([*argv, "--json", "-"]) == 2
    out, err = capsys.readouterr()
    problem = json.loads(out)["problems"][0]
    assert problem["code"] == "bad_diff" and problem["file"] == str(empty), problem
    assert f"{empty} [--diff]: the diff names no files (bad_diff)" in err, err
    assert not (tmp_path / "out").exists()


def test_cli_out_dash_is_stdout_not_a_directory_named_dash(tmp_path, monkeypatch, capsys):
    """``vendor --out -`` made a directory ``-`` in the working directory and wrote the patch file into it;
    ``-`` is stdout for every output. It is ``--stdout`` now (and refused with ``--json -`` alike)."""
    import json

    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(unified_diff(UTILS, UTILS_NEW, "vllm/v1/core/kv_cache_utils.py"))
    monkeypatch.chdir(tmp_path)
    argv = ["vendor", "--diff", str(diff), "--id", "PN0122", "--title", "t", "--tree", str(tree), "--out", "-"]
    assert sndr_main(argv) == 0
    assert parse_patch(capsys.readouterr().out, "stdout").id == "PN0122"
    assert not (tmp_path / "-").exists()
    assert sndr_main([*argv, "--json", "-"]) == 2
    assert json.loads(capsys.readouterr().out)["problems"][0]["code"] == "stdout_conflict"


def test_out_dir_is_never_written_through_a_symlink_and_is_checked_before_the_work(tmp_path, monkeypatch, capsys):
    """``vendor --out linkdir`` (linkdir -> a directory elsewhere) wrote elsewhere/<ID>-<slug>.toml and exit 0: the
    writer checked only the file's own name, never the directory the user named. --out DIR is an output path as
    every command's is (sndr.cli.check_output(directory=True) before the work, write_output(named_dir=True)): a
    symlink there (dangling or not), a FIFO or a file is refused (output_refused, exit 2, naming it and what it is),
    before the diff is vendored, and nothing is written anywhere. A new DIR (and the directories to it) is made."""
    import sndr.upstream.vendor as vendor_mod

    tree = make_tree(tmp_path / "site", PIN_FILES)
    diff = tmp_path / "d.patch"
    diff.write_text(series_diff())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link, dangling, fifo, plain = (tmp_path / n for n in ("link", "dangling", "fifo", "plain"))
    link.symlink_to(elsewhere)
    dangling.symlink_to(tmp_path / "nowhere")
    os.mkfifo(fifo)
    plain.write_text("x\n")
    argv = ["vendor", "--diff", str(diff), "--id", "PN0130", "--tree", str(tree)]
    real_vendor = vendor_mod.vendor_diff

    def never(*args, **kwargs):
        raise AssertionError("vendored although --out is refused")

    monkeypatch.setattr(vendor_mod, "vendor_diff", never)
    for where, said in ((link, f"it is a symlink to {elsewhere}"), (dangling, "it is a symlink to"),
                        (fifo, "it is a FIFO, not a directory"), (plain, "it is a regular file, not a directory")):
        rc = sndr_main([*argv, "--out", str(where)])
        err = capsys.readouterr().err
        assert rc == 2 and "(output_refused)" in err and f"{where}: --out: {said}" in err, err
        assert "Traceback" not in err
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "nowhere").exists()
    assert link.is_symlink() and dangling.is_symlink() and plain.read_text() == "x\n"
    monkeypatch.setattr(vendor_mod, "vendor_diff", real_vendor)
    new = tmp_path / "new" / "patches"
    assert sndr_main([*argv, "--out", str(new)]) == 0, capsys.readouterr().err
    assert [p.name for p in new.iterdir()] == ["PN0130-clamp-the-hit-length-to-the-model-length.toml"]
