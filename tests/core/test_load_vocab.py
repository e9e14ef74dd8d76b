"""Load-time checks of a patch file's words (issue 32 LOW): ``when`` values against each key's vocabulary,
the file name against the ``id``, the ``[[files]]`` table name, and profile facts."""

from __future__ import annotations

import textwrap

import pytest

from sndr.errors import SndrError
from sndr.load import parse_patch
from sndr.profile import parse_profile

BASE = textwrap.dedent('''\
    id = "PN0007"
    title = "t"
    when = WHEN

    [[files]]
    path = "vllm/x.py"

    [[files.edits]]
    name = "a"
    anchor = "x = 1\\n"
    replacement = "x = 2\\n"
    ''')


def _problems(text: str, name: str = "patches/PN0007-x.toml") -> list[str]:
    try:
        parse_patch(text, name)
    except SndrError as exc:
        return [p.render() for p in exc.problems]
    return []


@pytest.mark.parametrize(("when", "why"), [
    ('{ platform = "gpu" }', "when.platform 'gpu' matches none of cuda, rocm, cpu, xpu, tpu"),
    ('{ platform = ["cuda", "nvidia"] }', "when.platform 'nvidia' matches none of"),
    ('{ platform = "rcom" }', "(did you mean 'rocm'?)"),
    ('{ kv_cache_dtype = "FP8" }', "when.kv_cache_dtype 'FP8' is not a value vLLM reports: lower case"),
    ('{ spec_method = "MTP" }', "when.spec_method 'MTP' is not a value vLLM reports"),
    ('{ model_arch = "Qwen3 Next" }', "when.model_arch 'Qwen3 Next' is not a value vLLM reports"),
])
def test_a_when_value_outside_the_vocabulary_is_an_error_of_the_file(when, why):
    """``when = { platform = "gpu" }`` was accepted, so the patch was gated forever."""
    problems = _problems(BASE.replace("WHEN", when))
    assert problems and why in problems[0] and "patches/PN0007-x.toml" in problems[0], problems


@pytest.mark.parametrize("when", ['{ platform = "cuda" }', '{ platform = ["cuda", "rocm"] }', '{ platform = "cu*" }',
                                  '{ kv_cache_dtype = "fp8*" }', '{ quantization = "compressed-tensors" }',
                                  '{ quantization = "none" }', '{ model_arch = "Qwen3*ForCausalLM" }',
                                  '{ spec_method = ["mtp", "eagle3"] }', '{ gpu_capability = ">=8.9" }'])
def test_documented_values_and_patterns_load(when):
    assert _problems(BASE.replace("WHEN", when)) == []


def test_a_profile_fact_outside_the_vocabulary_is_an_error_with_its_line():
    with pytest.raises(SndrError) as exc:
        parse_profile('name = "p"\nplatform = "gpu"\n', "prod.toml")
    [p] = exc.value.problems
    assert p.file == "prod.toml" and p.line == 2 and "platform 'gpu' matches none of" in p.message
    assert parse_profile('platform = "cuda"\nkv_cache_dtype = "fp8_e4m3"\n', "ok.toml").facts["platform"] == "cuda"


def test_a_file_name_that_disagrees_with_its_id_is_said(tmp_path, capsys):
    """Was accepted silently. A warning (a set may order its files by name), in every apply report."""
    from hook_fixtures import make_patches, make_tree
    from sndr.__main__ import main as sndr_main
    from sndr.load import load_patch_set

    site = make_tree(tmp_path / "site")
    patches = make_patches(tmp_path / "patches", only=["F0001"])
    (patches / "F0001-answer.toml").rename(patches / "F0009-answer.toml")  # copied, id not changed
    ps = load_patch_set(patches, packs=False)
    [w] = ps.warnings
    assert (w.code, w.line, w.key) == ("name_mismatch", 1, "id")
    assert "the file name F0009-answer.toml does not start with its id F0001" in w.message
    for mode in (["--dry-run"], [], ["--verify"]):
        assert sndr_main(["apply", "--patches", str(patches), "--tree", str(site), *mode]) == 0
        out = capsys.readouterr().out
        assert "F0009-answer.toml:1 [id]: F0001: the file name F0009-answer.toml does not start with its id" in out
    (patches / "F0009-answer.toml").rename(patches / "F0001.toml")
    assert load_patch_set(patches, packs=False).warnings == []


def test_the_files_typos_name_the_header_line_and_the_right_key():
    text = BASE.replace("when = WHEN\n", "")
    one = _problems(text.replace("[[files]]", "[[file]]").replace("[[files.edits]]", "[[file.edits]]"))
    assert one[0].startswith("patches/PN0007-x.toml:4 [file]: unknown key 'file' (did you mean 'files'? "
                             "[[files]] is an array of tables)"), one
    table = _problems(text.replace("[[files]]", "[files]").split("[[files.edits]]")[0])
    assert table[0].startswith("patches/PN0007-x.toml:4 [files]: files is an array of tables: write [[files]] "
                               "(double brackets)"), table
    edit = _problems(text.replace("[[files.edits]]", "[[files.edit]]"))
    assert edit[0].startswith("patches/PN0007-x.toml:7 [files[0].edit]: unknown key 'edit' (did you mean 'edits'?"), edit


@pytest.mark.parametrize(("anchor_ws", "text_ws", "said"), [
    ("\t", "    ", "with 1 tab ('\\t') in the anchor, 4 spaces ('    ') in the target"),
    ("        ", "\t\t", "with 8 spaces ('        ') in the anchor, 2 tabs ('\\t\\t') in the target"),
])
def test_a_tab_indented_anchor_names_the_whitespace_as_the_cause(anchor_ws, text_ws, said):
    """docs/format.md promises the cause where visible; the message stripped the very whitespace at fault."""
    from sndr.classify import classify_edit
    from sndr.model import Edit

    edit = Edit(name="a", anchor=f"{anchor_ws}x = 1\n{anchor_ws}y = 2\n", replacement=f"{anchor_ws}x = 3\n")
    text = f"def f():\n{text_ws}x = 1\n{text_ws}y = 2\n"
    finding = classify_edit(edit, text, text)
    assert finding.verdict.value == "drifted" and finding.code == "whitespace", finding
    assert said in finding.reason and "sndr matches bytes exactly" in finding.reason, finding.reason


def test_the_shipped_set_is_named_after_its_ids():
    from sndr.load import load_patch_set

    assert load_patch_set(packs=False).warnings == []


def test_patch_files_in_a_subdirectory_are_said_not_silently_left_out(tmp_path, capsys):
    """A set split into folders (``patches/backports/PN0001-x.toml``) loaded only the top level, and the
    folders' patches were never applied, without a word. sndr still reads the top level only (the
    format's rule), but names every subdirectory that holds patch files, in every apply report."""
    from hook_fixtures import make_patches, make_tree
    from sndr.__main__ import main as sndr_main
    from sndr.load import load_patch_set

    site = make_tree(tmp_path / "site")
    patches = make_patches(tmp_path / "patches", only=["F0001", "F0002"])
    (patches / "backports").mkdir()
    (patches / "F0001-answer.toml").rename(patches / "backports" / "F0001-answer.toml")
    (patches / "_drafts").mkdir()  # '_' folders, like '_' files, are not patches: not said
    (patches / "_drafts" / "F0003-x.toml").write_text('id = "F0003"\ntitle = "t"\n')
    ps = load_patch_set(patches, packs=False)
    assert [p.id for p in ps.patches] == ["F0002"]
    [w] = ps.warnings
    assert (w.code, w.file) == ("patch_subdir", str(patches / "backports")), w
    assert "1 patch file(s) in this subdirectory are not read" in w.message and "F0001-answer.toml" in w.message
    assert sndr_main(["apply", "--patches", str(patches), "--tree", str(site), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and "backports: 1 patch file(s) in this subdirectory are not read" in out, out
