"""Relocation suggestions on small texts (no real trees needed)."""

from __future__ import annotations

from sndr.preflight.suggest import Relocator, anchor_lines, key_lines


def test_anchor_and_key_lines():
    assert anchor_lines("a\nb\n") == ["a", "b"]
    assert anchor_lines("a") == ["a"]
    keys = key_lines(["    return None", "    value = compute(alpha)", "    # a comment line here", ")"])
    assert keys == ["value = compute(alpha)"]
    assert key_lines(["    x = 1", "    return"]) == ["x = 1"]  # short anchors keep what they have


def _relocator(pin: dict[str, str], cand: dict[str, str]) -> Relocator:
    changed = [r for r in cand if pin.get(r) != cand[r]]
    return Relocator(pin.get, cand.get, changed)


BODY = "".join(f"    result_{i} = transform_{i}(tensor, scale)\n" for i in range(10))


def test_edited_in_place_prefers_same_qualname():
    pin = {"vllm/a.py": "def work(tensor, scale):\n" + BODY + "    return result_0\n"}
    edited = BODY.replace("transform_4(tensor, scale)", "transform_4(tensor, scale * 2)")
    cand = {"vllm/a.py": "import math\n\n\ndef work(tensor, scale):\n" + edited + "    return result_0\n"}
    anchor = "    result_4 = transform_4(tensor, scale)\n    result_5 = transform_5(tensor, scale)\n"
    got = _relocator(pin, cand).suggest(anchor, "vllm/a.py", qualname="work", pin_line=6)
    top = got[0]
    assert (top.file, top.line, top.qualname) == ("vllm/a.py", 9, "work")
    assert top.reasons[:2] == ("same qualname", "same file") and top.score == 100


def test_file_gone_content_found_in_heir():
    pin = {"vllm/old.py": "def work(tensor, scale):\n" + BODY + "    return result_0\n"}
    cand = {"vllm/pkg/new.py": "class Holder:\n    def work(self, tensor, scale):\n"
                               + BODY.replace("    ", "        ") + "        return result_0\n",
            "vllm/pkg/other.py": "x = 1\n"}
    anchor = "    result_7 = transform_7(tensor, scale)\n"
    r = _relocator(pin, cand)
    heirs = r.heirs("vllm/old.py")
    assert list(heirs) == ["vllm/pkg/new.py"] and heirs["vllm/pkg/new.py"] > 0.9
    top = r.suggest(anchor, "vllm/old.py", qualname="work", pin_line=9)[0]
    assert (top.file, top.line, top.end_line, top.qualname) == ("vllm/pkg/new.py", 10, 10, "Holder.work")
    assert "content moved here from vllm/old.py" in top.reasons


def test_renamed_def_found_without_exact_seed():
    pin = {"vllm/old.py": "def _parse_part(part, parser):\n" + BODY + "    return result_0\n"}
    cand = {"vllm/pkg/new.py": "def parse_part(part, parser):\n" + BODY + "    return result_0\n"}
    got = _relocator(pin, cand).suggest("def _parse_part(part, parser):\n", "vllm/old.py", qualname="_parse_part")
    assert (got[0].file, got[0].line) == ("vllm/pkg/new.py", 1)


def test_deleted_code_gets_nothing_confident():
    pin = {"vllm/a.py": "def gone():\n    spec_config = vllm_config.speculative_config\n    return spec_config.method\n"
                        "\n\ndef stay():\n    return 1\n"}
    cand = {"vllm/a.py": "def stay():\n    return 1\n", "vllm/b.py": "def unrelated():\n    return 2\n"}
    got = _relocator(pin, cand).suggest("    spec_config = vllm_config.speculative_config\n", "vllm/a.py",
                                        qualname="gone")
    assert all(s.score < 80 for s in got)


def test_unchanged_files_are_not_searched():
    """Code that moved has to land in text that changed: identical files are never scanned."""
    same = "def helper():\n    return very_specific_call(alpha, beta, gamma)\n"
    pin = {"vllm/a.py": "def f():\n    return very_specific_call(alpha, beta, gamma)\n", "vllm/c.py": same}
    cand = {"vllm/a.py": "def f():\n    return 0\n", "vllm/c.py": same}
    got = _relocator(pin, cand).suggest("    return very_specific_call(alpha, beta, gamma)\n", "vllm/a.py",
                                        qualname="f")
    assert all(s.file != "vllm/c.py" for s in got)


# ---------------------------------------------------------------------------- ranking rules, cut from real trees
#
# Each case is a real drifted anchor of vLLM 0.24.0 (lines cut from the cached
# release tree) bumped to 0.32.0, searched over the anchor's file and the real
# file that competes for it. Each test checks the rule picks the true place
# (found by difflib, tests/preflight_oracle.py, over the full trees) and that
# with the rule's weight set to zero the competitor wins: the rule decides.

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sndr.locate import scopes  # noqa: E402
from sndr.preflight import suggest as S  # noqa: E402

_ROOTS: dict[str, Path] = {}


@pytest.fixture(autouse=False)
def real_trees(vllm_root):
    """The fetched 0.24.0 and 0.32.0 trees (cached; marks the tests needs_wheels)."""
    for v in ("0.24.0", "0.32.0"):
        _ROOTS[v] = vllm_root(v)
    yield
    _ROOTS.clear()


def _tree_text(version: str, rel: str) -> str:
    return (_ROOTS[version] / rel).read_text(encoding="utf-8")


def _real_case(files: list[str], anchor_file: str, first: int, n: int, pin_v="0.24.0", cand_v="0.32.0"):
    pin = {rel: _tree_text(pin_v, rel) for rel in files}
    cand = {rel: _tree_text(cand_v, rel) for rel in files}
    anchor = "".join(pin[anchor_file].splitlines(keepends=True)[first - 1:first - 1 + n])
    assert anchor not in cand[anchor_file]  # drifted
    qualname = scopes(pin[anchor_file]).qualname(first)
    return pin, cand, anchor, qualname


def _top(pin, cand, anchor, file, qualname, line):
    got = _relocator(pin, cand).suggest(anchor, file, qualname=qualname, pin_line=line)
    assert got
    return got[0]


MLA = "vllm/v1/attention/backends/mla/flashattn_mla.py"
MLA_SIBLING = "vllm/v1/attention/backends/mla/flashmla.py"


def test_real_same_qualname_same_file_beats_same_name_elsewhere(real_trees, monkeypatch):
    """``FlashAttnMLAMetadataBuilder._build_decode``'s signature tail was edited at home (similarity 73);
    ``flashmla.py`` holds a ``_build_decode`` with the old text almost verbatim (similarity 99)."""
    pin, cand, anchor, q = _real_case([MLA, MLA_SIBLING], MLA, 205, 3)
    assert q == "FlashAttnMLAMetadataBuilder._build_decode"
    top = _top(pin, cand, anchor, MLA, q, 205)
    assert (top.file, top.qualname) == (MLA, q) and 216 <= top.line <= 222  # truth: lines 218-222
    assert top.reasons[:2] == ("same qualname", "same file")
    monkeypatch.setattr(S, "BONUS_SAME_QUALNAME", 0)
    monkeypatch.setattr(S, "BONUS_SAME_NAME", 0)
    assert _top(pin, cand, anchor, MLA, q, 205).file == MLA_SIBLING  # the evidence decides, not the text


def test_real_sibling_copy_penalty(real_trees, monkeypatch):
    """The same case from the other side: ``flashmla.py`` held these lines on the pin already, so it is a
    sibling copy, not where the code went."""
    pin, cand, anchor, q = _real_case([MLA, MLA_SIBLING], MLA, 205, 3)
    got = _relocator(pin, cand).suggest(anchor, MLA, qualname=q, pin_line=205)
    sibling = [s for s in got if s.file == MLA_SIBLING]
    assert got[0].file == MLA
    assert sibling and "a copy that was already there on the pin" in sibling[0].reasons
    monkeypatch.setattr(S, "PENALTY_COPY", 0)
    assert _top(pin, cand, anchor, MLA, q, 205).file == MLA_SIBLING


def test_real_edited_import_block_stays_home(real_trees, monkeypatch):
    """ultravox.py's import block was edited; another model module (new in 0.32.0) has similar imports."""
    home, other = "vllm/model_executor/models/ultravox.py", "vllm/model_executor/models/moss_transcribe_diarize.py"
    pin = {home: _tree_text("0.24.0", home)}
    cand = {home: _tree_text("0.32.0", home), other: _tree_text("0.32.0", other)}
    anchor = "".join(pin[home].splitlines(keepends=True)[7:10])
    assert anchor.startswith("from collections.abc import Iterable, Mapping, Sequence") and anchor not in cand[home]
    top = _top(pin, cand, anchor, home, "", 8)
    assert top.file == home and top.line <= 9 and top.end_line >= 8  # truth: lines 8-9
    monkeypatch.setattr(S, "BONUS_SAME_FILE", 0)
    assert _top(pin, cand, anchor, home, "", 8).file == other
