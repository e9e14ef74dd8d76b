"""Loader and model: every bad input names the file and the key or line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sndr.errors import SndrError
from sndr.load import load_patch_set, parse_patch

GOOD = textwrap.dedent("""\
    id = "PN0007"
    title = "Clamp prefix-cache hit length across groups"
    vllm = ">=0.32,<0.34"

    [[files]]
    path = "vllm/v1/core/kv_cache_coordinator.py"

    [[files.edits]]
    name = "clamp"
    anchor = '''
            curr_hit_length = hit_length
    '''
    replacement = '''
            curr_hit_length = min(hit_length, max_hit)
    '''
    merged_markers = ["min(hit_length, max_hit)"]
    """)


def _err(text: str) -> SndrError:
    with pytest.raises(SndrError) as info:
        parse_patch(text, "patches/PN0007-x.toml")
    return info.value


def test_design_example_parses_with_defaults():
    p = parse_patch(GOOD, "x.toml")
    assert (p.kind, p.lifecycle, p.default, p.requires) == ("text", "active", True, [])
    e = p.files[0].edits[0]
    # The newline right after ''' is not part of the string; the final one is.
    assert e.anchor == "        curr_hit_length = hit_length\n"
    assert e.required is True


def test_unknown_key_names_file_key_and_line():
    err = _err(GOOD.replace('name = "clamp"', 'name = "clamp"\nrequird = true'))
    (p,) = err.problems
    assert p.file == "patches/PN0007-x.toml"
    assert p.key == "files[0].edits[0].requird"
    assert "unknown key" in p.message
    assert p.line == 10


def test_wrong_type_names_key():
    err = _err(GOOD.replace('vllm = ">=0.32,<0.34"', 'default = "yes"'))
    assert err.problems[0].key == "default"
    assert err.problems[0].line == 3


def test_malformed_toml_has_line():
    err = _err(GOOD.replace('name = "clamp"', 'name = "clamp'))
    assert err.problems[0].code == "toml_syntax"
    assert err.problems[0].line == 9


@pytest.mark.parametrize("mutate, needle", [
    (lambda t: t.replace("curr_hit_length = hit_length\n'''", "\n'''"), "anchor is empty"),
    (lambda t: t.replace("min(hit_length, max_hit)\n'''", "hit_length\n'''"), "anchor equals replacement"),
    (lambda t: t.replace('id = "PN0007"', 'id = "7PN"'), "String should match pattern"),
    (lambda t: t.replace('">=0.32,<0.34"', '"at least 0.32"'), "not a PEP 440 specifier"),
    (lambda t: t.replace("vllm/v1/core", "../v1/core"), "must stay inside the tree"),
    (lambda t: t.replace('path = "vllm/', 'path = "/vllm/'), "is absolute"),
    (lambda t: 'kind = "banana"\n' + t, "Input should be 'text', 'runtime' or 'plugin'"),
])
def test_bad_values(mutate, needle):
    err = _err(mutate(GOOD))
    assert needle in err.render()
    assert all(p.file == "patches/PN0007-x.toml" for p in err.problems)


def test_repeated_edit_name_is_an_error():
    dup = GOOD + GOOD[GOOD.index("[[files.edits]]"):].replace("curr_hit_length = hit_length", "hit_length = 0")
    err = _err(dup)
    assert "used twice" in err.render()


def _write(d: Path, name: str, text: str) -> None:
    (d / name).write_text(text)


def test_set_level_errors(tmp_path):
    _write(tmp_path, "PN0007-a.toml", GOOD)
    _write(tmp_path, "PN0007-b.toml", GOOD)
    _write(tmp_path, "PN0008-c.toml", GOOD.replace("PN0007", "PN0008") + 'requires = ["PN9999"]\n'.join(["", ""]))
    (tmp_path / "PN0008-c.toml").write_text(GOOD.replace('id = "PN0007"', 'id = "PN0008"\nrequires = ["PN9999"]'))
    with pytest.raises(SndrError) as info:
        load_patch_set(tmp_path, packs=False)
    codes = sorted(p.code for p in info.value.problems)
    assert codes == ["duplicate_id", "unknown_id"]
    dup = next(p for p in info.value.problems if p.code == "duplicate_id")
    assert dup.file.endswith("PN0007-b.toml") and "PN0007-a.toml" in dup.message


def test_requires_cycle(tmp_path):
    for a, b in (("PA", "PB"), ("PB", "PA")):
        _write(tmp_path, f"{a}.toml", GOOD.replace('id = "PN0007"', f'id = "{a}"\nrequires = ["{b}"]'))
    with pytest.raises(SndrError) as info:
        load_patch_set(tmp_path, packs=False)
    assert [p.code for p in info.value.problems] == ["requires_cycle"]
    assert "PA -> PB -> PA" in info.value.render()


def test_files_starting_with_underscore_are_not_patches(tmp_path):
    _write(tmp_path, "PN0007.toml", GOOD)
    _write(tmp_path, "_pin.toml", "version = '0.32.0'\n")
    assert [p.id for p in load_patch_set(tmp_path, packs=False).patches] == ["PN0007"]


def test_a_missing_key_points_at_its_table_an_extra_key_at_its_own_line():
    """QA: renaming ``name`` to ``nam`` on PN0005's first edit reported line 43 (edits[1].name)."""
    from sndr.load import parse_patch, shipped_patches_dir

    text = next(shipped_patches_dir().glob("PN0005-*.toml")).read_text()
    lines = text.splitlines()
    first = next(n for n, ln in enumerate(lines) if ln.startswith("name = ") and lines[n - 1] == "[[files.edits]]")
    lines[first] = lines[first].replace("name =", "nam =")
    with pytest.raises(SndrError) as exc:
        parse_patch("\n".join(lines) + "\n", "PN0005.toml")
    where = {p.key: p.line for p in exc.value.problems}
    assert where == {"files[0].edits[0].name": first, "files[0].edits[0].nam": first + 1}  # header, own line
    assert lines[first - 1] == "[[files.edits]]"
    # A key of the second edit, and a key-like line inside a multi-line string, are never taken for it.
    fake = 'id = "PX0001"\ntitle = "t"\n[[files]]\npath = "vllm/a.py"\n[[files.edits]]\nanchor = \'\'\'\nname = "x"\n\'\'\'\n' \
           'replacement = "y"\n[[files.edits]]\nname = "b"\nanchor = "c"\nreplacement = "d"\n'
    with pytest.raises(SndrError) as exc:
        parse_patch(fake, "fake.toml")
    assert {p.key: p.line for p in exc.value.problems}.get("files[0].edits[0].name") == 5


def test_a_missing_patch_directory_from_sndr_patches_names_the_variable(tmp_path, monkeypatch):
    """``SNDR_PATCHES=/typo python -m sndr.apply`` said "/typo: patch directory does not exist" to an operator
    who passed no --patches: where the path came from was not said. Now the variable is named, with what to
    do; an explicit directory keeps the plain message."""
    monkeypatch.setenv("SNDR_PATCHES", str(tmp_path / "typo"))
    with pytest.raises(SndrError) as exc:
        load_patch_set()
    [p] = exc.value.problems
    assert p.code == "patches_dir_missing" and p.file == str(tmp_path / "typo")
    assert p.hint and "$SNDR_PATCHES" in p.hint and "--patches" in p.hint, p.hint
    with pytest.raises(SndrError) as exc:
        load_patch_set(tmp_path / "typo")
    assert exc.value.problems[0].hint is None
