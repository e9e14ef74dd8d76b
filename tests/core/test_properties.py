"""Hypothesis properties of the engine, on real disk writes through the real commit path."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sndr.apply import run_apply, run_revert
from sndr.load import PatchSet
from sndr.locate import find_all
from sndr.model import Patch

ALPHABET = st.characters(categories=("Lu", "Ll", "Nd", "Zs"), include_characters="\n\t=()[]:,.\r'\"é")
LINES = st.lists(st.text(alphabet=ALPHABET, min_size=0, max_size=30), min_size=3, max_size=30)
REL = "vllm/data/model.txt"  # not .py: random text need not compile


def _tree(text: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix="sndr-prop-"))
    (root / "vllm" / "data").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "version.py").write_text('__version__ = "0.32.0"\n')
    (root / REL).write_bytes(text.encode())
    return root


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _patch_set(edits: list[tuple[str, str]], extra_required: str | None = None) -> PatchSet:
    files_edits = [{"name": f"e{i}", "anchor": a, "replacement": r} for i, (a, r) in enumerate(edits)]
    if extra_required is not None:
        files_edits.append({"name": "missing", "anchor": extra_required, "replacement": extra_required + "@replaced"})
    p = Patch.model_validate({"id": "P1", "title": "prop", "files": [{"path": REL, "edits": files_edits}]})
    return PatchSet(patches=[p])


@st.composite
def text_and_edits(draw):
    lines = draw(LINES)
    text = "\n".join(lines) + "\n"
    n = draw(st.integers(1, 3))
    edits = []
    cur = text
    for _ in range(n):
        i = draw(st.integers(0, len(cur) - 1))
        j = draw(st.integers(i + 1, min(len(cur), i + 40)))
        anchor = cur[i:j]
        if not anchor.strip() or len(find_all(cur, anchor)) != 1:  # overlapping occurrences count
            continue
        repl = draw(st.text(alphabet=ALPHABET, min_size=1, max_size=40))
        if repl == anchor:
            continue
        # The edit must stay recognisable once applied (see classify_edit).
        nxt = cur.replace(anchor, repl, 1)
        if repl in cur or nxt.count(repl) != 1 or anchor in nxt.replace(repl, "", 1):
            continue
        edits.append((anchor, repl))
        cur = nxt
    assume(edits)
    return text, edits, cur


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(text_and_edits())
def test_apply_then_revert_is_identity(case):
    text, edits, expected = case
    root = _tree(text)
    before = (root / REL).read_bytes()
    report = run_apply(root, _patch_set(edits))
    assert report.ok, report.problems
    assert (root / REL).read_bytes() == expected.encode()
    assert run_revert(root).ok
    assert (root / REL).read_bytes() == before


@SETTINGS
@given(text_and_edits())
def test_apply_twice_equals_apply_once(case):
    text, edits, expected = case
    root = _tree(text)
    ps = _patch_set(edits)
    assert run_apply(root, ps).ok
    once = _digest(root)
    second = run_apply(root, ps)
    assert second.ok and second.files_written == []
    assert _digest(root) == once
    assert (root / REL).read_bytes() == expected.encode()


@SETTINGS
@given(text_and_edits(), st.text(alphabet="#~^", min_size=3, max_size=12))
def test_plan_never_writes_when_a_required_edit_fails(case, missing):
    text, edits, _ = case
    assume(missing not in text)
    root = _tree(text)
    before = _digest(root)
    report = run_apply(root, _patch_set(edits, extra_required=missing))
    assert not report.ok and report.exit_code == 1
    assert report.files_written == []
    assert _digest(root) == before
