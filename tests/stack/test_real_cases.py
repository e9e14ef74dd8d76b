"""Issue 31: two-patch cases cut from a real 260-patch stack on vLLM 0.24.0, as regression tests.

The target texts are small excerpts written here in the shape of the vLLM 0.24.0 files the
real patches touch (the project holds no third-party code); the patches reproduce the shape
of the real ones (dual-anchor variants, optional "post" edits, whole-line insertions).

Defect 1: an optional edit that sndr refuses (an overlap with an unordered patch, or its anchor
consumed by one) is a finding, never a silent absence. Defect 2: whole-line insertions are
judged by lines (no false ``overlap_conflict``), and line ranges never print end before start.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sndr.apply import run_apply, run_verify
from sndr.classify import diff_spans
from sndr.load import PatchSet
from sndr.model import Patch, Verdict
from sndr.plan import build_plan

SCHED = "vllm/v1/core/sched/scheduler.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"

# The shape of Scheduler._mamba_block_aligned_split in 0.24.0.
SCHED_TEXT = '''\
class Scheduler:
    def _mamba_block_aligned_split(
        self,
        request,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
    ) -> int:
        if request.num_output_tokens == 0:
            block_size = self.cache_config.block_size
            last_cache_position = request.num_tokens - request.num_tokens % block_size
            num_computed_tokens_after_sched = (
                num_new_local_computed_tokens + request.num_computed_tokens + num_new_tokens
            )
            if num_computed_tokens_after_sched < last_cache_position:
                # align to block_size
                num_new_tokens = num_new_tokens // block_size * block_size
            elif request.num_computed_tokens < last_cache_position < num_computed_tokens_after_sched:
                num_new_tokens = last_cache_position - request.num_computed_tokens
        return num_new_tokens
'''

# The shape of HybridKVCacheCoordinator.find_longest_cache_hit in 0.24.0.
COORD_TEXT = '''\
class HybridKVCacheCoordinator:
    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        hit_length = max_cache_hit_length
        hit_blocks_by_group = [None] * len(self.kv_cache_config.kv_cache_groups)
        while True:
            curr_hit_length = hit_length
            for spec, group_ids, manager_cls in self.attention_groups:
                hit_blocks = manager_cls.find_longest_cache_hit(
                    block_hashes=block_hashes,
                    max_length=curr_hit_length,
                )
                curr_hit_length = len(hit_blocks[0]) * spec.block_size
            if curr_hit_length >= hit_length:
                break
            hit_length = curr_hit_length
        return hit_blocks_by_group, hit_length
'''

# The shape of GPUModelRunner.propose_draft_token_ids in 0.24.0.
RUNNER_TEXT = '''\
class GPUModelRunner:
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids):
        num_scheduled_tokens = scheduler_output.total_num_scheduled_tokens
        if self.speculative_config.method == "ngram":
            draft_token_ids = self.drafter.propose(sampled_token_ids)
        elif self.speculative_config.use_eagle():
            # TODO(woosuk): Refactor the loop.
            req_ids = self.input_batch.req_ids
            next_token_ids = self._next_token_ids(req_ids, sampled_token_ids)
            draft_token_ids = self.drafter.propose(next_token_ids, num_scheduled_tokens)
        return draft_token_ids
'''

TEXTS = {SCHED: SCHED_TEXT, COORD: COORD_TEXT, RUNNER: RUNNER_TEXT}

P34_OLD = '''\
            if num_computed_tokens_after_sched < last_cache_position:
                # align to block_size
                num_new_tokens = num_new_tokens // block_size * block_size
'''
P34_NEW = '''\
            if num_computed_tokens_after_sched < last_cache_position:
                # align to block_size
                # [P34] zero-collapse deadlock guard
                aligned = num_new_tokens // block_size * block_size
                if aligned > 0:
                    num_new_tokens = aligned
'''
PN388_PRISTINE = '''\
                # align to block_size
                num_new_tokens = num_new_tokens // block_size * block_size
'''
PN388_POST_P34 = '''\
                aligned = num_new_tokens // block_size * block_size
                if aligned > 0:
                    num_new_tokens = aligned
'''
PN388_NEW = '''\
                # [PN388] block-aligned prefill split
                num_new_tokens = _pn388_align(num_new_tokens, block_size)
'''


def patch(pid: str, path: str, *edits: dict, **kw) -> Patch:
    return Patch.model_validate({"id": pid, "title": pid, **kw, "files": [{"path": path, "edits": list(edits)}]})


def edit(name: str, anchor: str, replacement: str, required: bool = True, **kw) -> dict:
    return {"name": name, "anchor": anchor, "replacement": replacement, "required": required, **kw}


def p34(**kw) -> Patch:
    return patch("P34", SCHED, edit("p34_deadlock_guard", P34_OLD, P34_NEW), **kw)


def pn388(groups: bool = False, **kw) -> Patch:
    g = {"group": "shape"} if groups else {}
    extra = {"groups": {"shape": "one_of"}} if groups else {}
    return patch("PN388", SCHED,
                 edit("pristine", PN388_PRISTINE, PN388_NEW, required=False, **g),
                 edit("post_p34", PN388_POST_P34, PN388_NEW.replace("# [PN388]", "# [PN388 on P34]"),
                      required=False, **g), **extra, **kw)


PN346_OLD = "            curr_hit_length = hit_length\n"
PN346_NEW = "            curr_hit_length = _pn346_mtp_boundary(hit_length, self.block_size)\n"
P85_SHADOW_OLD = "        hit_blocks_by_group = [None] * len(self.kv_cache_config.kv_cache_groups)\n"
P85_SHADOW_NEW = P85_SHADOW_OLD + "        shadow = self._p85_fine_shadow(block_hashes)  # [P85]\n"
# P85's "post" variant: written on the text PN346 produces (the line PN346 rewrote plus the next).
P85_POST_OLD = PN346_NEW + "            for spec, group_ids, manager_cls in self.attention_groups:\n"
P85_POST_NEW = PN346_NEW + "            curr_hit_length = shadow.clamp(curr_hit_length)  # [P85 post]\n" \
    + "            for spec, group_ids, manager_cls in self.attention_groups:\n"


def pn346(**kw) -> Patch:
    return patch("PN346", COORD, edit("boundary", PN346_OLD, PN346_NEW), **kw)


def p85(**kw) -> Patch:
    return patch("P85", COORD, edit("shadow", P85_SHADOW_OLD, P85_SHADOW_NEW),
                 edit("post", P85_POST_OLD, P85_POST_NEW, required=False), **kw)


EAGLE = "        elif self.speculative_config.use_eagle():\n"
TODO = "            # TODO(woosuk): Refactor the loop.\n"


def pn40(**kw) -> Patch:
    # The classifier hook is optional: on trees without the eagle branch it has nothing to hook.
    return patch("PN40", RUNNER,
                 edit("dflash", "        if self.speculative_config.method == \"ngram\":\n",
                      "        if self.speculative_config.method == \"dflash\":\n"
                      "            draft_token_ids = self._pn40_dflash(sampled_token_ids)\n"
                      "        elif self.speculative_config.method == \"ngram\":\n"),
                 edit("classifier", EAGLE + TODO, EAGLE + "            self._pn40_classify(scheduler_output)\n" + TODO,
                      required=False), **kw)


def pn300(**kw) -> Patch:
    # An unordered patch that rewrites the eagle branch the classifier hook anchors on.
    return patch("PN300", RUNNER, edit("eagle3", EAGLE, "        elif self.speculative_config.use_eagle3():\n"), **kw)


def plan_of(patches, **kw):
    return build_plan(PatchSet(patches=patches), TEXTS.get, "0.24.0", environ={}, **kw)


def by_id(plan):
    return {p.id: p for p in plan.patches}


def edit_of(plan, pid, name):
    return next(e for e in by_id(plan)[pid].edits if e.name == name)


# ----------------------------------------------------------------------------- defect 1: no silent drop


@pytest.mark.parametrize("groups", [False, True], ids=["two_optional_variants", "one_of_variants"])
def test_pn388_on_p34_unordered_is_a_finding_not_a_silent_drop(groups):
    plan = plan_of([p34(), pn388(groups)])
    st = by_id(plan)
    assert st["P34"].status == "applies"
    assert st["PN388"].status == "failed", [(e.name, e.verdict, e.reason) for e in st["PN388"].edits]
    post = edit_of(plan, "PN388", "post_p34")
    assert post.verdict == Verdict.CONFLICT and post.reason_code == "overlap_conflict" and post.conflict_with == ["P34"]
    assert {p.code for p in plan.problems} >= {"overlap_conflict"} and not plan.ok
    assert "PN388" not in "".join(c.new for c in plan.changes.values())  # nothing half-applied


def test_pn388_on_p34_unordered_under_keep_going_is_left_out_whole_and_named():
    plan = plan_of([p34(), pn388()], keep_going=True)
    # The first refused edit names the code: the pristine variant, whose anchor P34 consumed.
    assert plan.ok and [(lo.id, lo.code, lo.by) for lo in plan.left_out] == [("PN388", "conflict", "keep_going")]
    assert plan.applied == ["P34"] and "[P34]" in plan.changes[SCHED].new and "PN388" not in plan.changes[SCHED].new


def test_pn388_ordered_after_p34_applies_its_post_variant():
    plan = plan_of([p34(), pn388(after=["P34"])])
    assert plan.ok, [p.render() for p in plan.problems]
    assert edit_of(plan, "PN388", "post_p34").verdict == Verdict.APPLIES
    assert edit_of(plan, "PN388", "pristine").verdict == Verdict.OPTIONAL_ABSENT  # absent because P34 is ordered first
    assert "# [PN388 on P34]" in plan.changes[SCHED].new


def test_p85_post_variant_overlapping_pn346_fails_the_patch():
    plan = plan_of([pn346(), p85()])
    post = edit_of(plan, "P85", "post")
    assert post.verdict == Verdict.CONFLICT and post.reason_code == "overlap_conflict" and not post.required
    assert by_id(plan)["P85"].status == "failed" and not plan.ok
    assert any(p.code == "overlap_conflict" and p.patch == "P85" for p in plan.problems)


def test_pn40_classifier_anchor_consumed_by_an_unordered_patch_is_a_conflict():
    plan = plan_of([pn300(), pn40()])
    cls = edit_of(plan, "PN40", "classifier")
    assert cls.verdict == Verdict.CONFLICT and cls.reason_code == "conflict" and cls.conflict_with == ["PN300"]
    assert by_id(plan)["PN40"].status == "failed" and not plan.ok
    # Ordered, the absence is the author's: PN40's classifier hook is optional on a tree whose branch PN300 rewrote.
    plan = plan_of([pn300(), pn40(after=["PN300"])])
    assert plan.ok and edit_of(plan, "PN40", "classifier").verdict == Verdict.OPTIONAL_ABSENT
    assert by_id(plan)["PN40"].status == "applies"


def test_an_ambiguous_optional_edit_is_refused_not_dropped():
    # The anchor is present, twice: sndr refuses it (it never guesses which), so the patch fails, named.
    twice = "            draft_token_ids = self.drafter.propose("
    p = patch("PN41", RUNNER, edit("hook", TODO, TODO + "            self._pn41()\n"),
              edit("wrap", twice, "            draft_token_ids = self._pn41_wrap(", required=False))
    plan = plan_of([p])
    assert by_id(plan)["PN41"].status == "failed" and edit_of(plan, "PN41", "wrap").verdict == Verdict.AMBIGUOUS
    assert [pr.code for pr in plan.problems] == ["anchor_ambiguous"] and not plan.changes
    plan = plan_of([patch("PN41", RUNNER, *p.files[0].model_dump()["edits"], on_failure="skip")])
    assert plan.ok and [(lo.id, lo.code) for lo in plan.left_out] == [("PN41", "anchor_ambiguous")]


def test_an_optional_edit_absent_because_its_anchor_is_absent_is_still_fine():
    lone = patch("PN9", COORD, edit("a", PN346_OLD, PN346_NEW), edit("b", "        no_such_line()\n", "x\n", required=False))
    plan = plan_of([lone])
    assert plan.ok and edit_of(plan, "PN9", "b").verdict == Verdict.OPTIONAL_ABSENT


def _tree(root: Path, texts: dict[str, str]) -> Path:
    for rel, text in texts.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    info = root / "vllm-0.24.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n\n")
    return root


def test_apply_never_reads_applied_with_the_optional_text_absent(tmp_path):
    """The end-to-end symptom: the patch read `applied`, exit 0, verify passed, the text was absent."""
    tree = _tree(tmp_path / "site", TEXTS)
    ps = PatchSet(patches=[pn346(), p85()])
    r = run_apply(tree, ps, environ={})
    assert r.exit_code == 1 and not r.ok and (tree / COORD).read_text() == COORD_TEXT  # refused, nothing written
    r = run_apply(tree, ps, environ={}, keep_going=True)
    assert r.exit_code == 1 and [lo.id for lo in r.left_out] == ["P85"]
    text = (tree / COORD).read_text()
    assert "[P85" not in text and "_pn346_mtp_boundary" in text  # left out whole: not even its required edit
    v = run_verify(tree, ps, environ={})
    assert v.exit_code == 1 and any(p.code == "left_out" and p.patch == "P85" for p in v.problems)
    # Ordered as the author meant it, every edit is in the tree and verify agrees.
    ps = PatchSet(patches=[pn346(), p85(after=["PN346"])])
    r = run_apply(tree, ps, environ={})
    assert r.exit_code == 0, [p.render() for p in r.problems]
    text = (tree / COORD).read_text()
    assert "[P85 post]" in text and "[P85]" in text
    assert run_verify(tree, ps, environ={}).exit_code == 0


# ----------------------------------------------------------------------------- defect 2: judged by lines

# A whole-line insertion before a shared anchor, the new line sharing the anchor's indentation (or
# its "        # " comment prefix): the other patch's anchor starts on the re-emitted line.
INSERT_CASES = [
    ("indentation", EAGLE, "        # [A] eagle drafts are classified below\n" + EAGLE,
     EAGLE + TODO, EAGLE + "            self._b_hook()\n" + TODO),
    ("comment_prefix", TODO, "            # [A] see PN40\n" + TODO,
     TODO + "            req_ids = self.input_batch.req_ids\n",
     TODO + "            req_ids = list(self.input_batch.req_ids)  # [B]\n"),
]


@pytest.mark.parametrize("case", INSERT_CASES, ids=[c[0] for c in INSERT_CASES])
def test_whole_line_insertion_before_a_shared_anchor_is_not_an_overlap(case):
    _, a_old, a_new, b_old, b_new = case
    a, b = patch("A", RUNNER, edit("ins", a_old, a_new)), patch("B", RUNNER, edit("mod", b_old, b_new))
    one = plan_of([a, b])
    assert one.ok, [p.render() for p in one.problems]
    other = plan_of([b, a])
    assert other.ok and one.changes[RUNNER].new == other.changes[RUNNER].new  # the order does not matter


def test_a_change_inside_a_line_still_overlaps_by_lines():
    # B rewrites the line A changed (at other characters): the same line, an overlap.
    a = patch("A", RUNNER, edit("m", EAGLE, EAGLE.replace("():", "():  # [A]")))
    b = patch("B", RUNNER, edit("m", "        elif self.speculative", "        elif self.spec_cfg"))
    plan = plan_of([a, b])
    assert edit_of(plan, "B", "m").verdict == Verdict.CONFLICT and edit_of(plan, "B", "m").reason_code == "overlap_conflict"


def test_overlap_line_ranges_never_end_before_they_start():
    # B anchors inside the text A inserted: its pristine span is the one line where A inserted.
    a = patch("A", RUNNER, edit("ins", TODO, "            # [A] one\n            # [A] two\n" + TODO))
    b = patch("B", RUNNER, edit("mod", "            # [A] two\n", "            # [A] two (B)\n"))
    plan = plan_of([a, b])
    e = edit_of(plan, "B", "mod")
    assert e.reason_code == "overlap_conflict"
    spans = [(int(x), int(y)) for x, y in re.findall(r"lines (\d+)-(\d+)", e.reason)]
    assert len(spans) == 2 and all(x <= y for x, y in spans), e.reason
    assert spans[0] == (7, 7)  # the TODO line, where A's text sits


@pytest.mark.parametrize("anchor, replacement, changed", [
    (EAGLE, "        # c\n" + EAGLE, [(0, 12)]),          # shared indentation: whole line inserted
    (TODO, "            # new\n" + TODO, [(0, 18)]),       # shared "            # ": whole line inserted
    ("    x()", "    # c\n    x()", [(0, 8)]),            # no trailing newline
    ("a = 1\n", "a = 1  # c\n", [(5, 10)]),               # inside a line: precise (the planner widens it)
])
def test_diff_spans_aligns_insertions_on_lines(anchor, replacement, changed):
    got, equal = diff_spans(anchor, replacement)
    assert list(got) == changed
    for a0, r0, n in equal:
        assert anchor[a0:a0 + n] == replacement[r0:r0 + n]


# ----------------------------------------------------------------------------- variants (docs/format.md)


def _doc_variant_patch() -> Patch:
    import tomllib

    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    section = doc[doc.index("## Variants of one site"):]
    block = section[section.index("```toml\n") + len("```toml\n"):]
    return Patch.model_validate(tomllib.loads(block[:block.index("```\n")]))


@pytest.mark.parametrize("line, verdicts", [
    ("                num_new_tokens = num_new_tokens // block_size * block_size\n",
     {"split_dev134": Verdict.APPLIES, "split_dev212": Verdict.OPTIONAL_ABSENT}),
    ("                num_new_tokens = round_down(num_new_tokens, block_size)\n",
     {"split_dev134": Verdict.OPTIONAL_ABSENT, "split_dev212": Verdict.APPLIES}),
])
def test_the_documented_one_of_variants_apply_on_either_version(line, verdicts):
    p = _doc_variant_patch()
    text = SCHED_TEXT.replace(PN388_PRISTINE.splitlines(True)[1], line)
    plan = build_plan(PatchSet(patches=[p]), {SCHED: text}.get, "0.24.0", environ={})
    assert plan.ok and {e.name: e.verdict for e in plan.patches[0].edits} == verdicts
    assert "_align_split(num_new_tokens, block_size)" in plan.changes[SCHED].new
    # Neither variant: drifted, not a silent nothing_to_do.
    plan = build_plan(PatchSet(patches=[p]), {SCHED: SCHED_TEXT.replace(PN388_PRISTINE, "")}.get, "0.24.0", environ={})
    assert plan.patches[0].status == "failed" and {e.reason_code for e in plan.patches[0].edits} == {"group_unmatched"}
