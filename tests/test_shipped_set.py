"""The shipped patch set (``patches/``) on its pin, vLLM 0.32.0, and on the bump candidate 0.33.0.

Pure sndr: no vLLM install needed (the behaviour tests of each patch live in
``tests/patches/``). Trees are the cached wheels of both versions.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sndr.apply import run_apply, run_revert, run_verify
from sndr.load import load_patch_set, shipped_patches_dir
from sndr.model import GroupMode, Verdict
from sndr.plan import build_plan
from sndr.tree import open_tree

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return load_patch_set(packs=False)


def _plan(ps, root):
    tree = open_tree(root)
    return build_plan(ps, tree.read_text, tree.version, environ={})


@pytest.fixture(scope="module")
def pin_plan(shipped, vllm_pin_root):
    return _plan(shipped, vllm_pin_root)


@pytest.fixture(scope="module")
def candidate_plan(shipped, vllm_candidate_root):
    return _plan(shipped, vllm_candidate_root)


def by_prefix(ps, prefix):
    return [p for p in ps.patches if p.id.startswith(prefix)]


# ----------------------------------------------------------------------------- shape of the set


def test_totals(shipped):
    text_edits = sum(len(f.edits) for p in shipped.patches for f in p.files)
    files = {f.path for p in shipped.patches for f in p.files}
    assert len(shipped.patches) >= 25
    assert text_edits >= 60
    assert len(files) >= 15
    assert len([p for p in shipped.patches if p.kind == "runtime" and p.runtime]) >= 2
    assert len(by_prefix(shipped, "PN")) >= 12, "backports"
    assert len(by_prefix(shipped, "PG")) + len(by_prefix(shipped, "PR")) >= 8, "guards and diagnostics"
    assert len(by_prefix(shipped, "PG")) >= 8


def test_one_of_group_with_two_anchor_variants(shipped):
    groups = [(p.id, g) for p in shipped.patches for g, mode in p.groups.items() if mode == GroupMode.ONE_OF]
    assert groups
    for pid, g in groups:
        members = [e for f in shipped.by_id[pid].files for e in f.edits if e.group == g]
        assert len(members) >= 2
        assert len({e.anchor for e in members}) == len(members), "variants must differ in their anchors"


def test_runtime_patches_pin_their_target(shipped):
    for p in by_prefix(shipped, "PR"):
        assert p.kind == "runtime"
        for r in p.runtime:
            assert r.wrap, "shipped runtime patches wrap vLLM's function"
            assert r.replacement.startswith("sndr.runtime_patches.")
            assert r.signature or r.source_sha256


@pytest.mark.parametrize("patch_id", [p.id for p in load_patch_set(packs=False).patches])
def test_every_patch_is_documented_and_gated_to_the_pin(shipped, patch_id):
    p = shipped.by_id[patch_id]
    assert len(p.title) > 20
    assert len(" ".join(p.description.split())) > 150, "say why the patch exists"
    assert SpecifierSet(p.vllm).contains(Version("0.32.0"))
    for ref in p.upstream:
        assert ref.startswith("vllm#") and ref[5:].isdigit(), ref
    names = Path(shipped.source_of(p.id)).name
    assert names.startswith(p.id + "-") and names.endswith(".toml")


def test_patch_files_are_named_after_their_ids(shipped):
    for path in shipped_patches_dir().glob("P*.toml"):
        assert path.name.split("-", 1)[0] in shipped.by_id, path.name


# ----------------------------------------------------------------------------- the pin: 0.32.0


def test_whole_set_plans_cleanly_on_the_pin(pin_plan):
    assert pin_plan.ok, [p.to_json() for p in pin_plan.problems]
    for p in pin_plan.patches:
        if p.status == "gated":
            continue
        assert p.status in ("applies", "applied"), (p.id, p.status, p.reason)
        for e in p.edits:
            assert e.verdict in (Verdict.APPLIES, Verdict.OPTIONAL_ABSENT), (p.id, e.name, e.verdict, e.reason)


def test_only_opt_in_patches_are_gated_on_the_pin(shipped, pin_plan):
    gated = {p.id for p in pin_plan.patches if p.status == "gated"}
    assert gated == {p.id for p in shipped.patches if not p.default}


def test_one_of_resolves_to_the_pin_variant(pin_plan):
    pg2 = {e.name: e.verdict for p in pin_plan.patches if p.id == "PG0002" for e in p.edits}
    assert pg2 == {"define-check": Verdict.APPLIES, "call-0-32": Verdict.APPLIES,
                   "call-0-33": Verdict.OPTIONAL_ABSENT}


def test_cli_dry_run_on_a_copy_of_the_pin(pin_tree):
    proc = subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(pin_tree), "--dry-run", "-q"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _digest(root: Path, rels) -> dict[str, str]:
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in rels}


def test_apply_verify_revert_is_byte_exact(pin_tree, shipped, pin_plan):
    rels = sorted(pin_plan.changes)
    before = _digest(pin_tree, rels)
    applied = run_apply(pin_tree, shipped, environ={})
    assert applied.ok, [p.model_dump() for p in applied.problems]
    assert sorted(applied.files_written) == rels
    after = _digest(pin_tree, rels)
    assert all(before[r] != after[r] for r in rels)
    for rel in rels:
        assert (pin_tree / rel).read_text() == pin_plan.changes[rel].new
    verified = run_verify(pin_tree, shipped, environ={})
    assert verified.ok, [p.model_dump() for p in verified.problems]
    reverted = run_revert(pin_tree)
    assert reverted.ok, [p.model_dump() for p in reverted.problems]
    assert _digest(pin_tree, rels) == before


# ----------------------------------------------------------------------------- the bump: 0.33.0


def test_every_backport_is_merged_on_the_candidate(shipped, candidate_plan):
    status = {p.id: p for p in candidate_plan.patches}
    for p in by_prefix(shipped, "PN"):
        r = status[p.id]
        assert r.status == "merged", (p.id, r.status, [(e.name, e.verdict.value, e.reason) for e in r.edits])
        assert all(e.verdict == Verdict.MERGED for e in r.edits)


def test_guards_survive_the_bump_or_retire(shipped, candidate_plan):
    status = {p.id: p for p in candidate_plan.patches}
    for p in by_prefix(shipped, "PG"):
        assert status[p.id].status in ("applies", "merged"), (p.id, status[p.id].reason)
    assert status["PG0004"].status == "merged"  # 0.33.0 applies the prefill interval locally
    pg2 = {e.name: e.verdict for e in status["PG0002"].edits}
    assert pg2["call-0-33"] == Verdict.APPLIES and pg2["call-0-32"] == Verdict.OPTIONAL_ABSENT


def test_runtime_bindings_on_the_candidate(candidate_plan):
    """PR0002's target is unchanged in 0.33.0; PR0001's gained a parameter: genuine drift."""
    status = {p.id: p for p in candidate_plan.patches}
    assert [e.verdict for e in status["PR0002"].edits] == [Verdict.APPLIES]
    pr1 = status["PR0001"].edits
    assert [e.verdict for e in pr1] == [Verdict.DRIFTED]
    assert "has_topp_only_rows" in pr1[0].reason
