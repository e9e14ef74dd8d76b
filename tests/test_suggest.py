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
