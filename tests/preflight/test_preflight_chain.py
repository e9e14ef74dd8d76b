"""Issue 31 defect 5: `chain_broken` no longer hides where an anchor went when the anchor is not the
producer's text (re-emitted context is pristine), or when the candidate holds it verbatim."""

from __future__ import annotations

from preflight.test_preflight import _tree
from sndr.load import PatchSet
from sndr.model import Patch, Verdict
from sndr.preflight.analysis import run_preflight

BODY = "".join(f"    value_{i} = compute_thing_{i}(alpha, beta)\n" for i in range(8))
PIN = "import os\n\n\ndef helper(alpha, beta):\n" + BODY + "    return value_0\n\n\ndef keep():\n    return 1\n"


def _moved(body: str) -> dict[str, str]:
    """The candidate: helper moved into a class of a new module (re-indented), big.py keeps the rest."""
    return {"vllm/big.py": "import os\n\n\ndef keep():\n    return 1\n",
            "vllm/helpers/new_home.py": "import os\n\n\nclass Box:\n    def helper(self, alpha, beta):\n"
            + body.replace("    ", "        ") + "        return value_0\n"}


def line(i: int, tail: str = "") -> str:
    return f"    value_{i} = compute_thing_{i}(alpha, beta){tail}\n"


def edit_patch(pid: str, anchor: str, replacement: str, **kw) -> Patch:
    return Patch.model_validate({"id": pid, "title": pid, **kw, "files": [{"path": "vllm/big.py", "edits": [
        {"name": "e", "anchor": anchor, "replacement": replacement}]}]})


def _edit(report, pid):
    return next(p for p in report.patches if p.id == pid).edits[0]


def test_anchor_on_re_emitted_context_is_not_chained_and_gets_a_suggestion(tmp_path):
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/big.py": PIN})
    cand = _tree(tmp_path / "cand", "1.1.0", _moved(BODY))
    a = edit_patch("A", line(2) + line(3), line(2, "  # A") + line(3))  # re-emits value_3 unchanged
    b = edit_patch("B", line(3) + line(4), line(3) + line(4, "  # B"), after=["A"])
    report = run_preflight(PatchSet(patches=[a, b]), pin, cand, config=False)
    e = _edit(report, "B")
    assert e.verdict == Verdict.DRIFTED and e.chained_from == [] and e.chain_broken is None
    assert e.suggestions and e.suggestions[0].file == "vllm/helpers/new_home.py" and e.suggestions[0].similarity == 100


def test_chain_broken_keeps_only_a_verbatim_suggestion(tmp_path):
    a = edit_patch("A", line(3), line(3, "  # A"))
    b = edit_patch("B", line(3, "  # A") + line(4), line(3, "  # A") + line(4, "  # B"), after=["A"])
    pin = _tree(tmp_path / "pin", "1.0.0", {"vllm/big.py": PIN})
    # Upstream moved the function and took A's change with it: B's anchor is verbatim on the candidate.
    cand = _tree(tmp_path / "cand", "1.1.0", _moved(BODY.replace(line(3), line(3, "  # A"))))
    report = run_preflight(PatchSet(patches=[a, b]), pin, cand, config=False)
    e = _edit(report, "B")
    assert e.chained_from == ["A"] and e.chain_broken is not None and e.chain_broken.producer == "A"
    assert [(s.file, s.similarity) for s in e.suggestions][:1] == [("vllm/helpers/new_home.py", 100)]
    # Without A's text upstream, the nearest window is not B's anchor: no suggestion, the chain is the story.
    cand2 = _tree(tmp_path / "cand2", "1.1.0", _moved(BODY))
    e = _edit(run_preflight(PatchSet(patches=[a, b]), pin, cand2, config=False), "B")
    assert e.chain_broken is not None and e.suggestions == []

