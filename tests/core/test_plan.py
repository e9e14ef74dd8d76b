"""Table-driven tests of the planner (``sndr.plan``): gating, ordering, stacking, conflicts, failure policy.

Every scenario runs ``build_plan`` on real vLLM 0.32.0 files (``BlockPool``) read from the pin tree.
"""

from __future__ import annotations

import pytest

from sndr.classify import diff_spans
from sndr.load import PatchSet
from sndr.model import Patch, Verdict
from sndr.plan import build_plan, enabled_set, order_patches
from sndr.profile import parse_profile

REL = "vllm/v1/core/block_pool.py"
POP = "        ret: list[KVCacheBlock] = self.free_block_queue.popleft_n(num_blocks)\n"
WATCH = "        if num_blocks > self.get_num_free_blocks():\n"
HB = "            block.ref_cnt -= 1\n            if block.ref_cnt == 0 and not block.is_null:\n"
IF = "            if block.ref_cnt == 0 and not block.is_null:\n"
NEXT = "                if block.block_hash is None or not self.enable_caching:\n"


def P(pid: str, anchor: str, replacement: str, **kw) -> Patch:
    required = kw.pop("required", True)
    return Patch.model_validate({"id": pid, "title": pid, **kw, "files": [{"path": REL, "edits": [
        {"name": "e", "anchor": anchor, "replacement": replacement, "required": required}]}]})


@pytest.fixture(scope="module")
def read(vllm_pin_root):
    def r(rel):
        p = vllm_pin_root / rel
        return p.read_text() if p.exists() else None
    return r


def plan_of(read, patches, env=None, **kw):
    return build_plan(PatchSet(patches=patches), read, "0.32.0", environ=env or {}, check_compile=False, **kw)


# (id, patches, env, expected {patch: status}, expected problem codes, expected edit verdicts {patch: verdict})
SCENARIOS = [
    ("insert_after_then_edge_insert_before",
     [P("A", POP, POP + "        # A\n"), P("B", POP, "        # B\n" + POP)], {},
     {"A": "applies", "B": "applies"}, set(), {}),
    ("stacked_on_produced_text_with_after",
     [P("B", "        # A\n", "        # A\n        # B\n", after=["A"]), P("A", POP, POP + "        # A\n")], {},
     {"A": "applies", "B": "applies"}, set(), {}),
    ("stacked_on_produced_text_with_requires",
     [P("B", "        # A\n", "        # A2\n", requires=["A"]), P("A", POP, POP + "        # A\n")], {},
     {"A": "applies", "B": "applies"}, set(), {}),
    # the new-user review (stop 44): the same change in two unordered patches read "applies" + "applied"
    ("same_change_in_two_unordered_patches_is_a_conflict",
     [P("A", POP, POP + "        # A\n"), P("B", POP, POP + "        # A\n")], {},
     {"A": "applies", "B": "failed"}, {"overlap_conflict"}, {"B": Verdict.CONFLICT}),
    ("same_change_after_the_other_reads_applied",
     [P("A", POP, POP + "        # A\n"), P("B", POP, POP + "        # A\n", after=["A"])], {},
     {"A": "applies", "B": "applied"}, set(), {"B": Verdict.APPLIED}),
    ("a_copy_of_the_anchor_written_by_an_unordered_patch_is_a_conflict",
     [P("A", POP, POP + POP), P("B", POP, "        # B\n")], {},
     {"A": "applies", "B": "failed"}, {"overlap_conflict"}, {"B": Verdict.CONFLICT}),
    ("produced_text_without_order_is_a_conflict",
     [P("A", POP, POP + "        # A\n"), P("B", "        # A\n", "        # A2\n")], {},
     {"A": "applies", "B": "failed"}, {"overlap_conflict"}, {"B": Verdict.CONFLICT}),
    ("re_emitted_context_is_not_a_conflict",
     [P("A", HB, HB.replace("-= 1\n", "-= 1  # A\n")), P("B", IF + NEXT, IF + "                # B\n" + NEXT)], {},
     {"A": "applies", "B": "applies"}, set(), {}),
    ("same_bytes_conflict",
     [P("A", HB, HB.replace("-= 1\n", "-= 1  # A\n")), P("B", HB, HB.replace("-= 1\n", "-= 1  # B\n"))], {},
     {"A": "applies", "B": "failed"}, {"conflict"}, {"B": Verdict.CONFLICT}),
    ("after_never_gates",
     [P("A", POP, POP + "        # A\n", default=False), P("B", WATCH, "        # B\n" + WATCH, after=["A"])], {},
     {"A": "gated", "B": "applies"}, set(), {}),
    ("requires_gates",
     [P("A", POP, POP + "        # A\n", default=False), P("B", WATCH, "        # B\n" + WATCH, requires=["A"])], {},
     {"A": "gated", "B": "gated"}, set(), {}),
    ("skip_leaves_out_whole_and_dependents",
     [P("A", "        no_such_line = 1\n", "        no_such_line = 2  # sndr\n", on_failure="skip"),
      P("B", WATCH, "        # B\n" + WATCH, requires=["A"], on_failure="skip"), P("C", POP, POP + "        # C\n")], {},
     {"A": "left_out", "B": "left_out", "C": "applies"}, set(), {}),
    ("fail_policy_refuses_the_set",
     [P("A", "        no_such_line = 1\n", "        no_such_line = 2  # sndr\n"), P("C", POP, POP + "        # C\n")], {},
     {"A": "failed", "C": "applies"}, {"edit_drifted"}, {"A": Verdict.DRIFTED}),
    ("nothing_to_do",
     [P("A", "        no_such_line = 1\n", "        no_such_line = 2  # sndr\n", required=False)], {},
     {"A": "nothing_to_do"}, set(), {"A": Verdict.OPTIONAL_ABSENT}),
    ("when_without_profile_is_unknown",
     [P("A", POP, POP + "        # A\n", when={"platform": "cuda"})], {},
     {"A": "gated"}, set(), {"A": Verdict.GATED}),
    ("declared_conflicts_enabled",
     [P("A", POP, POP + "        # A\n", conflicts=["B"]), P("B", WATCH, "        # B\n" + WATCH)], {},
     {"A": "applies", "B": "applies"}, {"conflicts_enabled"}, {}),
]


@pytest.mark.parametrize("row", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_plan_table(read, row):
    _, patches, env, statuses, codes, verdicts = row
    plan = plan_of(read, patches, env)
    got = {p.id: p.status for p in plan.patches}
    assert got == statuses
    assert {p.code for p in plan.problems} == codes, [p.render() for p in plan.problems]
    for pid, v in verdicts.items():
        assert next(p for p in plan.patches if p.id == pid).edits[0].verdict == v


@pytest.mark.parametrize("a_kw, b_kw, keep_going, left", [
    ({}, {}, True, [("B", "keep_going", "fail")]),                     # --keep-going: the later patch goes
    ({}, {"on_failure": "skip"}, False, [("B", "on_failure", "skip")]),  # the later one's own policy allows it
    ({"on_failure": "skip"}, {}, False, [("A", "on_failure", "skip")]),  # only the earlier one may go
    ({"on_failure": "skip"}, {}, True, [("B", "keep_going", "fail")]),   # --keep-going still takes the later
])
def test_declared_conflict_settled_by_the_failure_policy(read, a_kw, b_kw, keep_going, left):
    """Issue 31: `conflicts` under --keep-going or skip leaves out one patch of the pair, named, code conflicts_enabled."""
    patches = [P("A", POP, POP + "        # A\n", conflicts=["B"], **a_kw), P("B", WATCH, "        # B\n" + WATCH, **b_kw)]
    plan = plan_of(read, patches, keep_going=keep_going)
    assert plan.ok, [p.render() for p in plan.problems]
    assert [(lo.id, lo.by, lo.on_failure) for lo in plan.left_out] == left
    lo = plan.left_out[0]
    other = "A" if lo.id == "B" else "B"
    assert lo.code == "conflicts_enabled" and f"conflicts with {other}" in lo.reason and "A.conflicts names B" in lo.reason
    assert {p.id: p.status for p in plan.patches} == {lo.id: "left_out", other: "applies"}


def test_declared_conflicts_chain_and_dependents_under_keep_going(read):
    patches = [P("A", POP, POP + "        # A\n", conflicts=["B"]), P("B", WATCH, "        # B\n" + WATCH, conflicts=["C"]),
               P("C", NEXT, "                # C\n" + NEXT), P("D", "    def __len__(self) -> int:\n", "    def __len__(self) -> int:  # D\n", requires=["B"])]
    plan = plan_of(read, patches, keep_going=True)
    assert plan.ok and plan.applied == ["A", "C"]  # B goes for A; B gone settles B-C; D requires B
    assert [(lo.id, lo.code) for lo in plan.left_out] == [("B", "conflicts_enabled"), ("D", "requires_left_out")]
    # Without --keep-going and with fail policies, the pair is a finding, and nothing is left out.
    plan = plan_of(read, patches)
    assert [p.code for p in plan.problems] == ["conflicts_enabled", "conflicts_enabled"] and not plan.left_out


def test_keep_going_overrides_fail_policy(read):
    patches = [P("A", "        no_such_line = 1\n", "        no_such_line = 2  # sndr\n"), P("C", POP, POP + "        # C\n")]
    plan = plan_of(read, patches, keep_going=True)
    assert plan.ok and [(lo.id, lo.by, lo.code) for lo in plan.left_out] == [("A", "keep_going", "edit_drifted")]
    assert plan.applied == ["C"] and plan.enabled == ["A", "C"]


def test_conflict_suggests_after_only_when_the_other_order_works(read):
    # B's two-line anchor spans A's insertion point; applied first, B leaves A's anchor intact.
    a = P("A", POP, POP + "        # A\n")
    b = P("B", POP + "\n", POP + "        # B\n\n")
    e = next(p for p in plan_of(read, [a, b]).patches if p.id == "B").edits[0]
    assert e.verdict == Verdict.CONFLICT and e.conflict_with == ["A"]
    assert 'add after = ["B"] to A' in e.hint


def test_when_with_profile(read):
    prof = parse_profile('platform = "cuda"\ngpu_capability = "8.0"\n', "p.toml")
    patches = [P("A", POP, POP + "        # A\n", when={"platform": "cuda"}),
               P("B", WATCH, "        # B\n" + WATCH, when={"gpu_capability": ">=8.9"})]
    plan = plan_of(read, patches, profile=prof)
    assert {p.id: (p.status, p.reason_code) for p in plan.patches} == {"A": ("applies", ""),
                                                                        "B": ("gated", "when_mismatch")}


def test_env_hint_names_the_real_variable(read):
    gates = enabled_set(PatchSet(patches=[P("P23_WIRE-1", POP, POP + "#\n", default=False)]), "0.32.0", {}).gates
    assert "SNDR_ENABLE_P23_WIRE_1=1" in gates["P23_WIRE-1"].reason
    gates = enabled_set(PatchSet(patches=[P("P23_WIRE-1", POP, POP + "#\n")]), "0.32.0",
                        {"SNDR_ENABLE_P23_WIRE_1": "0"}).gates
    assert gates["P23_WIRE-1"].reason == "disabled by SNDR_ENABLE_P23_WIRE_1=0"


def test_the_enabled_set_is_computed_in_one_place_and_every_consumer_reads_the_same(read):
    """ids, digest and gates: the planner, the startup resolution and verify's mismatch all take
    them from plan.enabled_set, so they agree (--only and an explicit profile included)."""
    from sndr.startup.resolve import build_resolved

    prof = parse_profile('platform = "cuda"\n', "p.toml")
    ps = PatchSet(patches=[P("B", "        # A\n", "        # A\n        # B\n", after=["A"]),
                           P("A", POP, POP + "        # A\n"),
                           P("C", WATCH, "        # C\n" + WATCH, default=False),
                           P("D", WATCH, WATCH + "        # D\n", when={"platform": "rocm"})])
    es = enabled_set(ps, "0.32.0", {}, profile=prof)
    assert [p.id for p in es.ordered] == ["A", "B", "C", "D"] and es.ids == ("A", "B")
    assert es.digest == ps.digest(["A", "B"]) != ps.digest()
    assert es.reasons() == {"C": "disabled_by_default: default = false (enable with SNDR_ENABLE_C=1)",
                            "D": es.gates["D"].code + ": " + es.gates["D"].reason}
    assert es.gates["D"].code == "when_mismatch"
    plan = plan_of(read, ps.patches, profile=prof)
    assert (plan.enabled, plan.digest) == (list(es.ids), es.digest)
    on = enabled_set(ps, "0.32.0", {"SNDR_ENABLE_C": "1"}, only=["c"], profile=prof)
    assert on.ids == ("C",) and on.gates["A"].code == "not_selected" and on.digest == ps.digest(["C"])
    plan = plan_of(read, ps.patches, {"SNDR_ENABLE_C": "1"}, only=["c"], profile=prof)
    assert (plan.enabled, plan.digest) == (["C"], on.digest)
    # the startup hook's resolution (no explicit profile: every `when` key unknown)
    plain = enabled_set(ps, "0.32.0", {})
    resolved = build_resolved(ps, "0.32.0", {})
    assert (resolved["enabled"], resolved["digest"], resolved["gate_reasons"]) == (
        list(plain.ids), plain.digest, plain.reasons())
    assert plain.gates["D"].code == "when_unknown"


def test_order_is_topological_over_requires_and_after_dependencies_just_before_their_dependent():
    ps = [P("D", POP, "x\n", after=["C"]), P("A", POP, "x\n"), P("C", POP, "x\n", requires=["B"]), P("B", POP, "x\n")]
    assert [p.id for p in order_patches(ps)] == ["B", "C", "D", "A"]
    ps = [P("A", POP, "x\n"), P("B", POP, "x\n"), P("C", POP, "x\n")]
    assert [p.id for p in order_patches(ps)] == ["A", "B", "C"]  # unordered: the set's order


@pytest.mark.parametrize("anchor, replacement, changed", [
    ("a\n", "a\nb\n", [(2, 4)]),                 # pure insertion after
    ("a\n", "b\na\n", [(0, 2)]),                 # pure insertion before
    ("x = 1\ny = 2\n", "x = 1\ny = 3\n", [(10, 11)]),  # one byte rewritten, context re-emitted
    ("a\nb\nc\n", "a\nc\n", [(2, 2)]),           # deletion point
    ("a\nb\nc\nd\n", "a\nB\nc\nD\n", [(2, 3), (6, 7)]),  # two separate changes
])
def test_diff_spans_table(anchor, replacement, changed):
    got, equal = diff_spans(anchor, replacement)
    assert list(got) == changed
    for a0, r0, n in equal:  # equal blocks really are equal
        assert anchor[a0:a0 + n] == replacement[r0:r0 + n]
