"""Issue 31, a migration path: ``python -m sndr import quilt|mbox SRC --to DIR --tree PIN``.

A series becomes patch files in series order with ``after`` chains, each member vendored against
the pin as the earlier members leave it; a member that cannot be vendored is named with why; the
written set loads, plans on the pin, and reproduces the series applied in order byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sndr.load import load_patch_set
from sndr.plan import build_plan
from sndr.upstream.series import import_series, mbox_members, quilt_members
from sndr.upstream.vendor import unified_diff
from upstream.test_vendor import PIN_FILES, SCHED, SCHED_NEW, UTILS, UTILS_NEW, mail, make_tree

S = "vllm/v1/core/sched/scheduler.py"
U = "vllm/v1/core/kv_cache_utils.py"

# Member 2 rewrites a line member 1 produced: it only places on the text member 1 leaves.
SCHED_2 = SCHED_NEW.replace("        self.max_hit_clamp = config.max_model_len\n",
                            "        self.max_hit_clamp = min(config.max_model_len, config.max_hit)\n")
# Member 3's context is nowhere in the pin: it cannot be vendored.
GHOST_OLD = "def nowhere():\n    return 0\n"
GHOST = unified_diff(GHOST_OLD, "def nowhere():\n    return 1\n", "vllm/v1/core/kv_cache_utils.py")
# Member 4 is independent of 3 (it follows 2 in the chain).
UTILS_4 = UTILS_NEW.replace("    return pool[:n]\n", "    return list(pool[:n])\n")


def series() -> list[tuple[str, str]]:
    return [
        ("0001-clamp-hit-length.patch",
         mail("[Core] Clamp the hit length (#45614)", "why", [unified_diff(SCHED, SCHED_NEW, S)])),
        ("0002-clamp-with-max-hit.patch",
         mail("[Core] Clamp with max_hit too", "why", [unified_diff(SCHED_NEW, SCHED_2, S)])),
        ("0003-ghost.patch", mail("[Misc] A change to code the pin lacks", "why", [GHOST])),
        ("0004-hash-extra.patch",
         mail("[Core] Hash extra keys", "why", [unified_diff(UTILS, UTILS_NEW, U), ])),
        ("0005-list-blocks.patch",
         mail("[Core] Return a list of blocks", "why", [unified_diff(UTILS_NEW, UTILS_4, U)])),
    ]


def _check_written(out: Path, pin: Path, ids_ok: list[str]) -> None:
    ps = load_patch_set(out, packs=False)
    assert [p.id for p in ps.patches] == ids_ok
    assert [p.after for p in ps.patches] == [[], *[[i] for i in ids_ok[:-1]]]  # the chain, in series order
    plan = build_plan(ps, lambda rel: (pin / rel).read_text() if (pin / rel).exists() else None, "0.32.0",
                      environ={})
    assert plan.ok, [p.render() for p in plan.problems]
    assert plan.changes[S].new == SCHED_2 and plan.changes[U].new == UTILS_4  # the series, applied in order


def test_mbox_directory_imports_in_order_and_names_what_it_cannot(tmp_path):
    pin = make_tree(tmp_path / "pin", PIN_FILES)
    src = tmp_path / "series"
    src.mkdir()
    for name, text in series():
        (src / name).write_text(text)
    members = mbox_members(src)
    assert [m.source for m in members] == [n for n, _ in series()]
    out = tmp_path / "out"
    results, code = import_series(members, lambda rel: (pin / rel).read_text() if (pin / rel).exists() else None,
                                  "0.32.0", out, prefix="M", kind="mbox")
    assert code == 1 and [(r.id, r.ok) for r in results] == [("M001", True), ("M002", True), ("M003", False),
                                                              ("M004", True), ("M005", True)]
    bad = results[2]
    assert bad.source == "0003-ghost.patch" and bad.problems and bad.problems[0]["code"] == "hunk_not_found"
    assert results[3].after == ["M002"]  # the chain skips what was not imported
    _check_written(out, pin, ["M001", "M002", "M004", "M005"])
    report = json.loads((out / "_import.json").read_text())
    assert [m["ok"] for m in report["members"]] == [True, True, False, True, True]
    assert results[0].title == "[Core] Clamp the hit length (#45614)"


def test_quilt_series_with_comments_and_strip(tmp_path):
    pin = make_tree(tmp_path / "pin", PIN_FILES)
    src = tmp_path / "q" / "patches"
    src.mkdir(parents=True)
    names = []
    for name, text in series():
        if "ghost" in name:
            continue
        # quilt patches: a description, then a plain diff (no mail headers), paths a/ b/ stripped by -p1
        diff = text[text.index("diff --git"):].split("-- \n")[0]
        (src / name).write_text("Description of the change.\n\n" + diff)
        names.append(name)
    (src / "series").write_text("# the stack\n" + "".join(f"{n} -p1\n" for n in names[:2]) + "\n"
                                + "".join(f"{n}  # trailing comment\n" for n in names[2:]))
    members = quilt_members(tmp_path / "q")
    assert [(m.source, m.strip) for m in members] == [(names[0], 1), (names[1], 1), (names[2], None), (names[3], None)]
    out = tmp_path / "out"
    results, code = import_series(members, lambda rel: (pin / rel).read_text() if (pin / rel).exists() else None,
                                  "0.32.0", out, prefix="Q", kind="quilt")
    assert code == 0, [r.problems for r in results]
    assert results[0].title == "clamp hit length"  # from the file name: no Subject in a quilt patch
    _check_written(out, pin, ["Q001", "Q002", "Q003", "Q004"])


def test_one_mbox_file_with_several_mails(tmp_path):
    path = tmp_path / "stack.mbox"
    path.write_text("".join(t for n, t in series() if "ghost" not in n))
    members = mbox_members(path)
    assert len(members) == 4 and all(m.text.startswith("From ") for m in members)


@pytest.mark.parametrize("setup, code, needle", [
    (lambda d: None, "import_no_series", "no quilt series"),
    (lambda d: (d / "series").write_text("a.patch -R\n"), "import_bad_series", "only -pN"),
    (lambda d: (d / "series").write_text("missing.patch\n"), "import_unreadable", "not a file"),
])
def test_bad_series_is_bad_input_naming_the_file(tmp_path, setup, code, needle):
    from sndr.errors import SndrError

    d = tmp_path / "q"
    d.mkdir()
    setup(d)
    with pytest.raises(SndrError) as info:
        quilt_members(d)
    (prob,) = info.value.problems
    assert prob.code == code and needle in prob.message and prob.file


def test_cli(tmp_path, capsys):
    """The command, in process through the one entry (sndr.__main__.main: the parser, the boundary and the exit
    status a process gets; three child interpreters cost ~1 s of CPU)."""
    from sndr.__main__ import main

    pin = make_tree(tmp_path / "pin", PIN_FILES)
    src = tmp_path / "series"
    src.mkdir()
    for name, text in series():
        (src / name).write_text(text)
    out = tmp_path / "out"
    cmd = ["import", "mbox", str(src), "--to", str(out), "--tree", str(pin)]
    assert main(cmd) == 1
    err = capsys.readouterr().err
    assert "0003-ghost.patch: NOT imported" in err and "imported 4 of 5" in err, err
    assert main(cmd) == 2 and "patch_exists" in capsys.readouterr().err  # never overwrites without --force
    assert main([*cmd, "--force"]) == 1 and len(list(out.glob("M*.toml"))) == 4



def test_cli_to_dash_is_refused_not_a_directory_named_dash(tmp_path, monkeypatch, capsys):
    """``import mbox SRC --to -`` made a directory ``-`` in the working directory; ``-`` is stdout for every
    output, and an import writes several files: refused (usage, exit 2) before any work."""
    from sndr.__main__ import main

    pin = make_tree(tmp_path / "pin", PIN_FILES)
    src = tmp_path / "series"
    src.mkdir()
    for name, text in series():
        (src / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["import", "mbox", str(src), "--to", "-", "--tree", str(pin)]) == 2
    assert "--to -" in capsys.readouterr().err
    assert not (tmp_path / "-").exists()



def test_cli_to_dir_is_never_written_through_a_symlink_and_a_refused_file_leaves_nothing_written(
        tmp_path, monkeypatch, capsys):
    """``import mbox SRC --to linkdir`` (linkdir -> a directory elsewhere) wrote every patch file and _import.json
    there, exit 0: --to was mkdir'ed and written into without a check. It is the directory the user named, an
    output path as every command's (sndr.cli.check_output(directory=True), before any work): a symlink, dangling
    or not, a FIFO or a file there is refused (output_refused, exit 2, naming it). And an import writes several
    files: a FIFO (or a symlink) at DIR/_import.json was replaced after the patch files were written; every file
    is checked before any is written now (sndr.cli.write_outputs), so a refused one leaves nothing written."""
    import os

    import sndr.upstream.series as series_mod
    from sndr.__main__ import main

    pin = make_tree(tmp_path / "pin", PIN_FILES)
    src = tmp_path / "series"
    src.mkdir()
    for name, text in series():
        (src / name).write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link, dangling, fifo, plain = (tmp_path / n for n in ("link", "dangling", "fifo", "plain"))
    link.symlink_to(elsewhere)
    dangling.symlink_to(tmp_path / "nowhere")
    os.mkfifo(fifo)
    plain.write_text("x\n")
    real_import = series_mod.import_series

    def never(*args, **kwargs):
        raise AssertionError("imported although --to is refused")

    monkeypatch.setattr(series_mod, "import_series", never)
    for where, said in ((link, f"it is a symlink to {elsewhere}"), (dangling, "it is a symlink to"),
                        (fifo, "it is a FIFO, not a directory"), (plain, "it is a regular file, not a directory")):
        assert main(["import", "mbox", str(src), "--to", str(where), "--tree", str(pin)]) == 2
        err = capsys.readouterr().err
        assert "(output_refused)" in err and f"{where}: --to: {said}" in err and "Traceback" not in err, err
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "nowhere").exists() and plain.read_text() == "x\n"
    monkeypatch.setattr(series_mod, "import_series", real_import)

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "_import.json")  # the last file the import writes
    assert main(["import", "mbox", str(src), "--to", str(out), "--tree", str(pin)]) == 2
    err = capsys.readouterr().err
    assert f"{out / '_import.json'}: --to: it is a FIFO" in err and "(output_refused)" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["_import.json"]  # no patch file was written before it
    (out / "_import.json").unlink()
    assert main(["import", "mbox", str(src), "--to", str(out / "new"), "--tree", str(pin)]) == 1
    assert len(list((out / "new").glob("M*.toml"))) == 4 and (out / "new" / "_import.json").is_file()
