"""Table-driven tests of the one verdict function, ``sndr.classify.classify_edit`` (and groups).

Texts are real vLLM 0.32.0 source (``vllm/v1/core/block_pool.py``), transformed per row.
"""

from __future__ import annotations

import pytest

from sndr.classify import Finding, classify_create, classify_edit, resolve_group
from sndr.model import Edit, GroupMode, Verdict

REL = "vllm/v1/core/block_pool.py"
POP = "        ret: list[KVCacheBlock] = self.free_block_queue.popleft_n(num_blocks)\n"
DEC = "            block.ref_cnt -= 1\n"  # occurs twice in the file
INS = POP + "        # sndr: popped\n"
POP_N = POP.replace("popleft_n(num_blocks)", "popleft_n(num_blocks, check=True)")
MISS = '        logger.debug("cache miss for %s", block_hash)\n'  # never in the file
RET = "        return None\n"  # occurs twice in the file
RET0 = "\n        if self._reuse_watchers:\n"  # follows POP
RAISE = '            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")\n'  # precedes POP, then a blank line


@pytest.fixture(scope="module")
def text(vllm_pin_root):
    return (vllm_pin_root / REL).read_text()


def E(anchor=POP, replacement=INS, **kw) -> Edit:
    return Edit(name="e", anchor=anchor, replacement=replacement, **kw)


# (id, edit kwargs, text transform, pristine transform or None, expected verdict, expected code)
ROWS = [
    ("applies", {}, lambda t: t, None, Verdict.APPLIES, ""),
    ("applied_insertion", {}, lambda t: t.replace(POP, INS), None, Verdict.APPLIED, "applied"),
    ("ambiguous", {"anchor": DEC, "replacement": DEC + "# x\n"}, lambda t: t, None, Verdict.AMBIGUOUS,
     "anchor_ambiguous"),
    ("drifted", {}, lambda t: t.replace(POP, POP.replace("popleft_n", "pop_n")), None, Verdict.DRIFTED,
     "anchor_missing"),
    ("drifted_first_line", {"anchor": POP + "\n        if self._reuse_watchers:\n"},
     lambda t: t.replace("\n        if self._reuse_watchers:\n", "\n        if self._watchers:\n"), None,
     Verdict.DRIFTED, "anchor_changed"),
    ("whitespace", {"anchor": POP.replace("\n", "  \n")}, lambda t: t, None, Verdict.DRIFTED, "whitespace"),
    ("crlf", {}, lambda t: t.replace("\n", "\r\n"), None, Verdict.DRIFTED, "line_endings"),
    ("optional_absent", {"required": False}, lambda t: t.replace(POP, ""), None, Verdict.OPTIONAL_ABSENT,
     "anchor_missing"),
    ("merged_marker_in_pristine", {"merged_markers": ["popleft_n(num_blocks)"]}, lambda t: t, None,
     Verdict.MERGED, "merged_marker"),
    ("own_marker_is_not_a_merge", {"merged_markers": ["# sndr: popped"]}, lambda t: t.replace(POP, INS),
     lambda t: t, Verdict.APPLIED, "applied"),
    # The anchor occurs once in the pristine file, but an earlier patch of the set changed it.
    ("conflict", {}, lambda t: t.replace(POP, POP.replace("ret:", "ret :")), lambda t: t, Verdict.CONFLICT,
     "conflict"),
    ("conflict_optional", {"required": False}, lambda t: t.replace(POP, POP.replace("ret:", "ret :")),
     lambda t: t, Verdict.OPTIONAL_ABSENT, "conflict"),
    # Absent in the pristine file too: drift, not a conflict.
    ("drift_not_conflict", {}, lambda t: t.replace(POP, ""), lambda t: t.replace(POP, ""), Verdict.DRIFTED,
     "anchor_missing"),
    # QA repro (a): a drop edit whose anchor never was in the file; its remaining text
    # ("return None") occurs elsewhere. A pure deletion is never recognised as applied.
    ("pure_deletion_never_applied", {"anchor": MISS + RET, "replacement": RET}, lambda t: t, None,
     Verdict.DRIFTED, "deletion_unverifiable"),
    ("pure_deletion_optional", {"anchor": MISS + RET, "replacement": RET, "required": False}, lambda t: t,
     None, Verdict.OPTIONAL_ABSENT, "deletion_unverifiable"),
    # ... even once it really was deleted: the text cannot tell (a merged marker can).
    ("pure_deletion_applied_is_unverifiable", {"anchor": POP + RET0, "replacement": RET0},
     lambda t: t.replace(POP + RET0, RET0), None, Verdict.DRIFTED, "deletion_unverifiable"),
    ("pure_deletion_merged_marker", {"anchor": POP + RET0, "replacement": RET0,
                                     "merged_markers": ["self._notify_reuse(ret)"]},
     lambda t: t.replace(POP + RET0, RET0), None, Verdict.MERGED, "merged_marker"),
    # QA repro (b): "x\n" is the tail of "curr_mm_idx\n" (line 329), not a line of its own.
    ("replacement_mid_line_not_applied", {"anchor": "        y = 1\n", "replacement": "x\n"}, lambda t: t, None,
     Verdict.DRIFTED, "anchor_missing"),
    # Legitimate applied cases with the anchor gone: a replacement at the anchor's alignment.
    ("applied_replacement", {"anchor": POP, "replacement": POP_N}, lambda t: t.replace(POP, POP_N), None,
     Verdict.APPLIED, "applied"),
    ("applied_replacement_alignment_from_pristine", {"anchor": POP, "replacement": POP_N},
     lambda t: t.replace(POP, POP_N), lambda t: t, Verdict.APPLIED, "applied"),
    ("applied_mid_line_anchor", {"anchor": "popleft_n(num_blocks)", "replacement": "popleft_n(n=num_blocks)"},
     lambda t: t.replace("popleft_n(num_blocks)", "popleft_n(n=num_blocks)"), None, Verdict.APPLIED, "applied"),
    ("applied_deletion_with_added_text", {"anchor": POP + RET0, "replacement": "        ret = []\n" + RET0},
     lambda t: t.replace(POP + RET0, "        ret = []\n" + RET0), None, Verdict.APPLIED, "applied"),
    # A deletion with a whole line kept before it and text after it: the two were not adjacent
    # before, so finding them together shows the deletion (a join).
    ("applied_deletion_join", {"anchor": RAISE + "\n" + POP, "replacement": RAISE + POP},
     lambda t: t.replace(RAISE + "\n" + POP, RAISE + POP), None, Verdict.APPLIED, "applied"),
    # The same join text absent: drift, not a false applied.
    ("deletion_join_absent", {"anchor": RAISE + "\n" + POP, "replacement": RAISE + POP},
     lambda t: t.replace(RAISE, ""), None, Verdict.DRIFTED, "anchor_missing"),
    # The anchor ended a line in the pristine file; the replacement occurs, but not ending a line.
    ("replacement_off_alignment", {"anchor": "popleft_n(num_blocks)", "replacement": "popleft_n(n=num_blocks)"},
     lambda t: t.replace("popleft_n(num_blocks)", "popleft_n(n=num_blocks) or []"), lambda t: t,
     Verdict.CONFLICT, "conflict"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_classify_edit_table(text, row):
    _, kw, now, pristine, verdict, code = row
    f = classify_edit(E(**kw), now(text), pristine(text) if pristine else None)
    assert (f.verdict, f.code) == (verdict, code), f.reason
    if verdict == Verdict.APPLIES:
        assert text[f.offset:f.offset + len(POP)] == POP
    if verdict == Verdict.AMBIGUOUS:
        assert len(f.offsets) == 2 and all(text[o:o + len(DEC)] == DEC for o in f.offsets)


def test_file_missing(text):
    assert classify_edit(E(), None).verdict == Verdict.FILE_MISSING


GROUP_ROWS = [
    # (mode, member verdicts, expected)
    (GroupMode.ONE_OF, {"a": Verdict.APPLIES, "b": Verdict.DRIFTED}, {"a": Verdict.APPLIES, "b": Verdict.OPTIONAL_ABSENT}),
    (GroupMode.ONE_OF, {"a": Verdict.APPLIES, "b": Verdict.APPLIES}, {"a": Verdict.AMBIGUOUS, "b": Verdict.AMBIGUOUS}),
    (GroupMode.ONE_OF, {"a": Verdict.DRIFTED, "b": Verdict.DRIFTED}, {"a": Verdict.DRIFTED, "b": Verdict.DRIFTED}),
    (GroupMode.ANY_OF, {"a": Verdict.APPLIES, "b": Verdict.APPLIES}, {"a": Verdict.APPLIES, "b": Verdict.APPLIES}),
    (GroupMode.ANY_OF, {"a": Verdict.CONFLICT, "b": Verdict.DRIFTED}, {"a": Verdict.DRIFTED, "b": Verdict.DRIFTED}),
]


@pytest.mark.parametrize("mode, members, expected", GROUP_ROWS)
def test_resolve_group_table(mode, members, expected):
    out = resolve_group(mode, "g", {n: Finding(v, offset=0) for n, v in members.items()})
    assert {n: f.verdict for n, f in out.items()} == expected


@pytest.mark.parametrize("content, now, pristine_missing, verdict", [
    ("x = 1\n", None, True, Verdict.APPLIES),
    ("x = 1\n", "x = 1\n", True, Verdict.APPLIED),
    ("x = 1\n", "x = 1\n", False, Verdict.MERGED),
    ("x = 1\n", "x = 2\n", False, Verdict.DRIFTED),
])
def test_classify_create_table(content, now, pristine_missing, verdict):
    assert classify_create(content, now, pristine_missing).verdict == verdict
