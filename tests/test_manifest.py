"""Manifests on the real vLLM 0.32.0 pin: deterministic, accurate, and loud when stale."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.errors import SndrError
from sndr.load import load_patch_set
from sndr.manifest import Manifest, build_manifest, load_manifest, trusted_offsets, write_manifest
from sndr.model import Verdict
from sndr.plan import build_plan
from sndr.tree import open_tree
from tests.conftest import CANDIDATE, PIN

COORD = "vllm/v1/core/kv_cache_coordinator.py"
POOL = "vllm/v1/core/block_pool.py"

# Patches written against real 0.32.0 anchors. block_pool.py has non-ASCII text
# before its anchor, so its byte offset and character offset differ.
PATCHES = {
    "PT0001-clamp.toml": f"""
id = "PT0001"
title = "Clamp the hit length"
vllm = ">=0.32"

[[files]]
path = "{COORD}"

[[files.edits]]
name = "clamp"
anchor = '''
            curr_hit_length = hit_length
'''
replacement = '''
            curr_hit_length = min(hit_length, max_cache_hit_length)
'''
""",
    "PT0002-pool.toml": f"""
id = "PT0002"
title = "Annotate free block count"

[[files]]
path = "{POOL}"

[[files.edits]]
name = "count"
anchor = '''
        return self.free_block_queue.num_free_blocks
'''
replacement = '''
        return self.free_block_queue.num_free_blocks  # sndr: counted
'''

[[files.edits]]
name = "legacy"
required = false
anchor = '''
        return self.legacy_free_block_count
'''
replacement = '''
        return self.legacy_free_block_count  # sndr
'''
""",
    "PT0003-old.toml": f"""
id = "PT0003"
title = "Only for old releases"
vllm = "<0.30"

[[files]]
path = "{COORD}"

[[files.edits]]
name = "old"
anchor = '''
        hit_length = max_cache_hit_length
'''
replacement = '''
        hit_length = int(max_cache_hit_length)
'''
""",
}


@pytest.fixture
def patches(tmp_path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    for name, text in PATCHES.items():
        (d / name).write_text(text.lstrip())
    return d


@pytest.fixture
def pin():
    tree = open_tree(f"vllm=={PIN}")
    yield tree
    tree.close()


def _cli(*args) -> int:
    return sndr_main(["manifest", *(str(a) for a in args)])


# ----------------------------------------------------------------------------- determinism


def test_rebuild_is_byte_identical(pin, patches, tmp_path):
    patch_set = load_patch_set(patches)
    first = write_manifest(build_manifest(pin, patch_set), tmp_path / "a").read_bytes()
    second = write_manifest(build_manifest(open_tree(pin.root), load_patch_set(patches)), tmp_path / "b").read_bytes()
    assert first == second
    wheel = next((pin.root.parent.parent / "wheels").glob(f"vllm-{PIN}-*.whl"), None)
    if wheel is not None:  # the same content read from the zip: still the same bytes
        with open_tree(wheel) as w:
            assert build_manifest(w, patch_set).to_json().encode() == first
    assert _cli("build", "--tree", f"vllm=={PIN}", "--patches", patches, "--out", tmp_path / "c") == 0
    assert (tmp_path / "c" / f"vllm-{PIN}.json").read_bytes() == first
    data = json.loads(first)
    assert list(data) == sorted(data) and "time" not in first.decode().lower()


def test_caller_environment_does_not_leak(pin, patches, monkeypatch):
    before = build_manifest(pin, load_patch_set(patches)).to_json()
    monkeypatch.setenv("SNDR_ENABLE_PT0001", "0")
    assert build_manifest(pin, load_patch_set(patches)).to_json() == before


# ----------------------------------------------------------------------------- content


def test_records_positions_and_hashes(pin, patches):
    m = build_manifest(pin, load_patch_set(patches))
    assert (m.vllm_version, m.tree_digest) == (PIN, pin.digest)
    clamp = m.edit("PT0001", "clamp")
    assert clamp.verdict == Verdict.APPLIES
    assert (clamp.file, clamp.line, clamp.qualname) == (COORD, 838, "HybridKVCacheCoordinator.find_longest_cache_hit")
    anchor = "            curr_hit_length = hit_length\n"
    assert clamp.anchor_sha256 == hashlib.sha256(anchor.encode()).hexdigest()
    assert pin.read_bytes(COORD)[clamp.offset:].startswith(anchor.encode())

    count = m.edit("PT0002", "count")
    anchor = b"        return self.free_block_queue.num_free_blocks\n"
    raw = pin.read_bytes(POOL)
    assert raw[count.offset:].startswith(anchor)
    assert pin.read_text(POOL)[count.char_offset:].startswith(anchor.decode())
    assert count.offset > count.char_offset  # non-ASCII text precedes the anchor
    assert count.qualname == "BlockPool.get_num_free_blocks"
    assert m.edit("PT0002", "legacy").verdict == Verdict.OPTIONAL_ABSENT

    old = next(p for p in m.patches if p.id == "PT0003")
    assert (old.status, old.reason_code) == ("gated", "version_mismatch")
    assert m.files[POOL].pristine_sha256 == hashlib.sha256(raw).hexdigest()
    assert sorted(m.files) == [POOL, COORD]


def test_schema_exports():
    schema = Manifest.model_json_schema()
    assert {"tree_digest", "patches", "files", "vllm_version"} <= set(schema["properties"])
    assert "ManifestEdit" in schema["$defs"]


# ----------------------------------------------------------------------------- check


def test_check_passes_then_catches_staleness(pin, patches, tmp_path, capsys):
    anchors = tmp_path / "anchors"
    assert _cli("build", "--tree", f"vllm=={PIN}", "--patches", patches, "--out", anchors) == 0
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 0
    assert load_manifest(anchors / f"vllm-{PIN}.json").patch_set_digest == load_patch_set(patches).digest()

    # A changed replacement: same anchor, different patch.
    f = patches / "PT0001-clamp.toml"
    f.write_text(f.read_text().replace("min(hit_length, max_cache_hit_length)", "min(hit_length, 1 << 30)"))
    capsys.readouterr()
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 1
    err = capsys.readouterr().err
    assert "stale" in err and "PT0001: patch definition changed" in err and "PT0001.clamp: replacement_sha256" in err

    # A removed patch and a new one are both named.
    assert _cli("build", "--tree", f"vllm=={PIN}", "--patches", patches, "--out", anchors) == 0
    (patches / "PT0003-old.toml").rename(patches / "PT0004-old.toml")
    text = (patches / "PT0004-old.toml").read_text().replace('"PT0003"', '"PT0004"')
    (patches / "PT0004-old.toml").write_text(text)
    capsys.readouterr()
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 1
    err = capsys.readouterr().err
    assert "PT0003: in the manifest but no longer in the patch set" in err and "PT0004: new patch" in err


def test_check_fails_an_up_to_date_manifest_that_records_a_drifted_edit(pin, patches, tmp_path, capsys):
    """`manifest build` exits 1 on a required edit that does not apply; `check` said "up to date" and exit 0
    over the same state (the new-user review, stop 44). One rule for both now (manifest.failing_edits)."""
    f = patches / "PT0001-clamp.toml"
    f.write_text(f.read_text().replace("            curr_hit_length = hit_length\n",
                                       "            curr_hit_length = hit_length_gone\n", 1))  # no such anchor
    anchors = tmp_path / "anchors"
    assert _cli("build", "--tree", f"vllm=={PIN}", "--patches", patches, "--out", anchors) == 1
    capsys.readouterr()
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "up to date" in text and "PT0001.clamp: drifted on vllm" in text, text


def test_check_catches_a_moved_pin(patches, pin_subtree, tmp_path, capsys):
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    assert _cli("build", "--tree", site, "--patches", patches, "--out", anchors) == 0
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0
    path = site / COORD
    path.write_text("# upstream moved things\n" + path.read_text())
    capsys.readouterr()
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 1
    err = capsys.readouterr().err
    assert "tree digest" in err and "PT0001.clamp" in err and f"{COORD}: pristine sha256" in err


def test_check_prints_a_rebuild_command_that_fixes_the_checked_manifest(patches, pin_subtree, tmp_path, capsys):
    """``check --patches P --anchors A`` said "missing; run: python -m sndr manifest build --tree T" (and
    "stale; rebuild with: ..." alike): run as printed, that builds the *shipped* set's manifest into the
    shipped anchors/ (refused on an installed sndr), and the checked manifest stays missing or stale. The
    command now carries --patches and --out; run as printed, the next check passes."""
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    for state in ("missing", "stale"):
        if state == "stale":
            f = patches / "PT0001-clamp.toml"
            f.write_text(f.read_text().replace("min(hit_length, max_cache_hit_length)", "min(hit_length, 1 << 30)"))
        capsys.readouterr()
        assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 1
        line = next(x for x in capsys.readouterr().err.splitlines() if f": {state}" in x)
        argv = shlex.split(line.split("python -m sndr ", 1)[1])
        assert argv[:2] == ["manifest", "build"], line
        assert argv[argv.index("--patches") + 1] == str(patches), line
        assert argv[argv.index("--out") + 1] == str(anchors / f"vllm-{PIN}.json"), line
        assert sndr_main(argv) == 0
        assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0


def test_build_out_dash_is_stdout_not_a_directory_named_dash(patches, pin_subtree, tmp_path, monkeypatch, capsys):
    """``manifest build --out -`` made a directory named ``-`` in the working directory and wrote
    ``-/vllm-0.32.0.json`` into it; ``-`` is stdout for every output of every command (``sndr.cli.write_output``).
    Now stdout holds the manifest, byte for byte the file ``--out FILE.json`` writes, and nothing else."""
    site = pin_subtree([COORD, POOL])
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert _cli("build", "--tree", site, "--patches", patches, "--out", "-") == 0
    got = capsys.readouterr()
    assert not (tmp_path / "-").exists()
    assert json.loads(got.out)["vllm_version"] == PIN and "wrote" not in got.out
    assert _cli("build", "--tree", site, "--patches", patches, "--out", tmp_path / "m.json") == 0
    assert (tmp_path / "m.json").read_text() == got.out


def test_check_missing_manifest_for_tree(patches, tmp_path, capsys):
    assert _cli("check", "--tree", f"vllm=={CANDIDATE}", "--patches", patches, "--anchors", tmp_path / "none") == 1
    assert f"vllm-{CANDIDATE}.json: missing" in capsys.readouterr().err
    assert _cli("check", "--patches", patches, "--anchors", tmp_path / "none") == 1


def test_bad_input_exit_2(patches, tmp_path):
    assert _cli("build", "--tree", tmp_path / "nope", "--patches", patches, "--out", tmp_path) == 2
    assert _cli("build", "--patches", patches, "--out", tmp_path / "empty") == 2  # no pin to default to
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / f"vllm-{PIN}.json").write_text("{}")
    assert _cli("check", "--patches", patches, "--anchors", tmp_path / "bad") == 2


def test_patched_tree_builds_from_its_pristine_copies(patches, pin_subtree, tmp_path, capsys):
    """The audit's new-user pass: `manifest build` refused a tree sndr patched (tree_patched) although the
    ledger's pristine copies in .sndr/objects are a pristine view of it. It builds from that view, byte for
    byte the manifest of the tree before apply (a file changed by hand since apply too: its stored copy is
    what upstream shipped), says so, and `manifest check` agrees."""
    from sndr.apply import run_apply

    site = pin_subtree([COORD, POOL])
    ps = load_patch_set(patches)
    clean = build_manifest(open_tree(site), ps).to_json()
    assert run_apply(site, ps, environ={}).ok and "sndr: counted" in (site / POOL).read_text()
    notes: list[str] = []
    assert build_manifest(open_tree(site), ps, notes).to_json() == clean
    assert len(notes) == 1 and "pristine copies" in notes[0] and ".sndr/objects" in notes[0], notes
    with (site / COORD).open("a") as f:
        f.write("# a hand edit after apply\n")
    capsys.readouterr()
    assert _cli("build", "--tree", site, "--patches", patches, "--out", tmp_path / "m.json") == 0
    out = capsys.readouterr().out
    assert (tmp_path / "m.json").read_text() == clean
    assert "note: " in out and "patched by sndr: built from the pristine copies of its 2 patched file(s)" in out, out
    anchors = tmp_path / "anchors"
    assert _cli("build", "--tree", site, "--patches", patches, "--out", anchors) == 0
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0


def test_patched_tree_without_a_pristine_view_is_refused_naming_the_file(patches, pin_subtree, tmp_path, capsys):
    """Refused (tree_patched, exit 2, the file named, nothing written) only where no pristine view exists:
    a stored pristine copy is gone, or an interrupted commit is pending (the journal)."""
    from sndr.apply import run_apply

    site = pin_subtree([COORD, POOL])
    ps = load_patch_set(patches)
    assert run_apply(site, ps, environ={}).ok
    state = site / ".sndr"
    ledger = json.loads((state / "ledger.json").read_text())
    obj = state / "objects" / ledger["files"][COORD]["pristine_sha256"]
    obj.rename(tmp_path / "kept")
    with pytest.raises(SndrError) as exc:
        build_manifest(open_tree(site), ps)
    p = exc.value.problems[0]
    assert (p.code, p.file) == ("tree_patched", COORD) and "object_missing" in p.message, p
    capsys.readouterr()
    assert _cli("build", "--tree", site, "--patches", patches, "--out", tmp_path / "m.json") == 2
    err = capsys.readouterr().err
    assert COORD in err and "(tree_patched)" in err and not (tmp_path / "m.json").exists(), err
    (tmp_path / "kept").rename(obj)
    (state / "journal.json").write_text("{}")
    with pytest.raises(SndrError) as exc:
        build_manifest(open_tree(site), ps)
    p = exc.value.problems[0]
    assert p.code == "tree_patched" and p.file.endswith(".sndr/journal.json") and "--verify" in (p.hint or ""), p


# ----------------------------------------------------------------------------- output and input paths


def test_build_out_never_writes_through_a_symlinked_directory(patches, pin_subtree, tmp_path, capsys):
    """``manifest build --out DIR`` with DIR a symlink to a directory elsewhere wrote DIR/vllm-0.32.0.json there,
    exit 0 (as did ``--out LINK.json`` to a directory): the final symlink check of the one writer saw only the
    file name inside it. DIR is the path the user named, an output path like FILE.json: refused (output_refused,
    exit 2, naming it and where it points), nothing written anywhere."""
    site = pin_subtree([COORD, POOL])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("anchors", "anchors.json"):
        link = tmp_path / name
        link.symlink_to(elsewhere, target_is_directory=True)
        capsys.readouterr()
        assert _cli("build", "--tree", site, "--patches", patches, "--out", link) == 2
        err = capsys.readouterr().err
        assert f"{link}: --out: it is a symlink to {elsewhere}" in err and "(output_refused)" in err, err
        assert list(elsewhere.iterdir()) == [] and link.is_symlink()
    real = tmp_path / "real"
    assert _cli("build", "--tree", site, "--patches", patches, "--out", real) == 0  # made, and written into
    assert load_manifest(real / f"vllm-{PIN}.json").vllm_version == PIN


def test_build_refuses_what_it_cannot_write_before_it_builds(patches, pin_subtree, tmp_path, capsys, monkeypatch):
    """The file ``--out DIR`` gets (DIR/vllm-<version>.json) was checked only when written, after the build: a
    symlink or FIFO there was refused once the work was done; a FIFO named as --out read "an existing file that
    is not .json" (usage). Each is output_refused now, naming the path and what it is, before the build runs."""
    import sndr.manifest

    site = pin_subtree([COORD, POOL])

    def no_build(*args, **kwargs):
        raise AssertionError("built although the output is refused")

    monkeypatch.setattr(sndr.manifest, "build_manifest", no_build)
    victim = tmp_path / "victim.json"
    victim.write_text("kept\n")
    out = tmp_path / "anchors"
    out.mkdir()
    (out / f"vllm-{PIN}.json").symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for dest, path, what in ((out, out / f"vllm-{PIN}.json", f"it is a symlink to {victim}"),
                             (fifo, fifo, "it is a FIFO, not a directory")):
        capsys.readouterr()
        assert _cli("build", "--tree", site, "--patches", patches, "--out", dest) == 2
        err = capsys.readouterr().err
        assert f"{path}: --out: {what}" in err and "(output_refused)" in err and "Traceback" not in err, err
    assert victim.read_text() == "kept\n" and (out / f"vllm-{PIN}.json").is_symlink()


def test_check_anchors_names_a_directory_and_a_manifest_file_is_refused(patches, pin_subtree, tmp_path, capsys):
    """``check --anchors m.json`` (the file ``build --out m.json`` wrote) read it as a directory: "no manifest in
    m.json ...; run: ... --out m.json" (exit 1), and with --tree "m.json/vllm-0.32.0.json: missing". --anchors
    names the directory of the manifests (its --help and docs/format.md): a file, FIFO or device is refused,
    naming it (anchors_not_a_dir, exit 2); for a vllm-<version>.json the hint is its directory."""
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    single = tmp_path / "m.json"
    assert _cli("build", "--tree", site, "--patches", patches, "--out", anchors) == 0
    assert _cli("build", "--tree", site, "--patches", patches, "--out", single) == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind, hint in ((single, "a regular file", "found there by its name, vllm-<version>.json"),
                             (anchors / f"vllm-{PIN}.json", "a regular file", f"hint: --anchors {anchors} "),
                             (fifo, "a FIFO", "found there by its name")):
        for tree in ((), ("--tree", site)):
            capsys.readouterr()
            assert _cli("check", *tree, "--patches", patches, "--anchors", path) == 2
            err = capsys.readouterr().err
            assert f"{path} [--anchors]: --anchors is {kind}, not a directory" in err, err
            assert "(anchors_not_a_dir)" in err and hint in err, err
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0


def test_check_names_what_is_wrong_with_a_manifest(patches, pin_subtree, tmp_path, capsys):
    """A bad manifest read "not a valid manifest: 1 validation error for Manifest" (no line, no field) for
    malformed JSON, a wrong field and non-UTF-8 bytes alike, and a directory in its place "Is a directory
    (os_error)". Each names the file and the line, the field or what it is now."""
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    assert _cli("build", "--tree", site, "--patches", patches, "--out", anchors) == 0
    path = anchors / f"vllm-{PIN}.json"
    good = json.loads(path.read_text())
    wrong = json.loads(path.read_text())
    wrong["patches"][1]["edits"][0]["verdict"] = "bogus"
    cases = [
        ('{\n  "format": 1,\n  oops\n}\n', f"{path}:3: not a valid manifest: malformed JSON", "manifest_corrupt"),
        (json.dumps(wrong), f"{path}: not a valid manifest (1 error(s)): patches[1].edits[0].verdict: Input should "
                            "be", "manifest_corrupt"),
        ('{"format": 1}', "vllm_version: Field required; tree_digest: Field required", "manifest_corrupt"),
        (b'{\n"tool": "\xff"}', f"{path}:2: the manifest is not UTF-8", "not_utf8"),
        (None, f"{path}: the manifest is a directory", "not_regular"),
    ]
    for content, said, code in cases:
        path.unlink() if path.is_file() else path.rmdir()
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        capsys.readouterr()
        assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 2
        err = capsys.readouterr().err
        assert said in err and f"({code})" in err and "Traceback" not in err, err
    path.rmdir()
    path.write_text(json.dumps(good, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0


def test_check_never_hangs_on_a_fifo_manifest(patches, pin_subtree, tmp_path):
    """A FIFO named vllm-0.32.0.json in --anchors hung ``manifest check`` for ever (read_bytes on a FIFO waits
    for a writer). It is read as every input is now (sndr.fsio.read_regular): refused, naming it, exit 2."""
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    os.mkfifo(anchors / f"vllm-{PIN}.json")
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "sndr", "manifest", "check", "--patches", str(patches),
                           "--anchors", str(anchors), "--tree", str(site)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(repo)))
    assert proc.returncode == 2, proc.stderr
    assert f"{anchors / f'vllm-{PIN}.json'}: the manifest is not a regular file" in proc.stderr, proc.stderr
    assert "(not_regular)" in proc.stderr


def test_check_names_the_manifest_whose_name_gives_the_pin(patches, tmp_path, capsys, monkeypatch):
    """Without --tree the pin is read from each manifest's name: ``vllm-foo.json`` said "'foo' is not a PEP 440
    version", and an unopenable pin "vllm==0.99.0 is not in the cache", neither naming the file they came from."""
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    odd = anchors / "vllm-foo.json"
    odd.write_text("{}")
    capsys.readouterr()
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 2
    err = capsys.readouterr().err
    assert f"{odd} [--anchors]: 'foo' in this manifest's name is not a PEP 440 version" in err, err
    odd.unlink()
    (anchors / "vllm-0.99.0.json").write_text("{}")
    monkeypatch.setenv("SNDR_OFFLINE", "1")
    assert _cli("check", "--patches", patches, "--anchors", anchors) == 2
    err = capsys.readouterr().err
    assert "(offline)" in err and f"vllm==0.99.0 is the pin named by {anchors / 'vllm-0.99.0.json'}" in err, err


def test_an_empty_path_or_tree_is_refused_never_the_working_directory_or_the_default(patches, tmp_path,
                                                                                     monkeypatch, capsys):
    """An unset variable (``--tree "$TREE"``): ``check --tree ""`` checked the shipped manifest's pin instead and
    said "up to date" (exit 0); ``--anchors ""`` and ``--patches ""`` read the working directory (``Path("")``),
    and ``build --out ""`` wrote vllm-0.32.0.json into it. Each is refused now (exit 2), nothing written."""
    monkeypatch.chdir(tmp_path)
    for argv, said in ((["check", "--tree", ""], "argument --tree: an empty path names nothing"),
                       (["check", "--anchors", ""], "argument --anchors: an empty path names nothing"),
                       (["check", "--patches", ""], "argument --patches: an empty path names nothing"),
                       (["build", "--tree", f"vllm=={PIN}", "--patches", str(patches), "--out", ""],
                        "argument --out: an empty path names nothing")):
        capsys.readouterr()
        assert _cli(*argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "up to date" not in err, err
    assert list(tmp_path.iterdir()) == [patches]


def test_build_and_check_say_what_the_set_does_on_the_tree(patches, pin_subtree, tmp_path, capsys):
    """"wrote ... (3 patches, vllm 0.32.0 ...)" read the same for a tree where every patch applies and one
    outside every patch's version range (0.10.0 with the shipped set: 36 gated, exit 0). The line counts the
    patches by status."""
    site = pin_subtree([COORD, POOL])
    anchors = tmp_path / "anchors"
    capsys.readouterr()
    assert _cli("build", "--tree", site, "--patches", patches, "--out", anchors) == 0
    assert f"(3 patches: 2 applies, 1 gated; vllm {PIN}, tree " in capsys.readouterr().out
    assert _cli("check", "--tree", site, "--patches", patches, "--anchors", anchors) == 0
    assert f"up to date (3 patches: 2 applies, 1 gated; vllm {PIN})" in capsys.readouterr().out


# ----------------------------------------------------------------------------- fast path


def test_trusted_offsets_match_the_slow_path(pin, patches, pin_subtree):
    patch_set = load_patch_set(patches)
    m = build_manifest(pin, patch_set)
    plan = build_plan(patch_set, pin.read_text, pin.version, environ={})
    slow = {(e.patch, e.name): e.offset for p in plan.patches for e in p.edits if e.verdict == Verdict.APPLIES}
    shas = {rel: hashlib.sha256(pin.read_bytes(rel)).hexdigest() for rel in m.files}
    assert trusted_offsets(m, patch_set, shas) == slow and slow

    # A file whose pristine bytes differ is never trusted; the others still are.
    site = pin_subtree([COORD, POOL])
    (site / COORD).write_text("# moved\n" + (site / COORD).read_text())
    shas[COORD] = hashlib.sha256((site / COORD).read_bytes()).hexdigest()
    fast = trusted_offsets(m, patch_set, shas)
    assert ("PT0001", "clamp") not in fast and fast[("PT0002", "count")] == slow[("PT0002", "count")]

    # A changed patch is never trusted either.
    f = patches / "PT0002-pool.toml"
    f.write_text(f.read_text().replace("# sndr: counted", "# sndr: counted!"))
    assert ("PT0002", "count") not in trusted_offsets(m, load_patch_set(patches), shas)
