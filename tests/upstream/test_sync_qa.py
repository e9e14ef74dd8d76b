"""QA trial of the pin bump: each defect reproduced as it was found, then the fixed behaviour.

1. ``pin advance --patches gp`` passed on a preflight run with ``--patches sub``, and on a manifest
   that records ``file_missing`` for gp's only patch.
2. ``--benchmark-ref`` accepted an empty file.
3. ``sync decide`` / ``pin advance`` wrote into an installed sndr's ``_data/patches``.
4. a backwards range planned silently; ``ported-as`` accepted an unknown id; the manifest
   rebuild hint was not a runnable command.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.load import load_patch_set
from sndr.upstream.pin import gate_benchmark, gate_manifest, gate_queue, load_queue, rebuild_hint
from upstream.test_sync import (  # noqa: F401, F811 - scripted and source are fixtures
    BENCH,
    BLOCK_POOL,
    GOOD_PREFLIGHT,
    PIN_FILE_NAME,
    _dir_tree,
    _queue,
    _write_patch,
    gates_ok,
    scripted,
    source,
)
from upstream.test_sync_history import releases  # noqa: F401 - a fixture

MISSING = "vllm/v1/core/no_such_module.py"


def _sets(tmp_path: Path):
    sub, gp = tmp_path / "sub", tmp_path / "gp"
    _write_patch(sub, "PN1", BLOCK_POOL, "        return ret\n")
    _write_patch(gp, "GP1", MISSING, "    return 1\n")  # file_missing on every target
    return sub, gp


def _gp_manifest(path: Path, gp) -> Path:
    """The manifest `manifest build --patches gp` writes on the target: gp's one patch is file_missing."""
    path.write_text(json.dumps({
        "format": 1, "tool": "sndr", "vllm_version": "0.33.0", "tree_digest": "a" * 64,
        "patch_set_digest": gp.digest(), "files": {MISSING: {"pristine_sha256": None}},
        "patches": [{"id": "GP1", "kind": "text", "digest": gp.patches[0].digest(), "status": "failed",
                     "reason_code": "file_missing", "edits": [{"name": "e", "file": MISSING, "kind": "text",
                                                               "required": True, "verdict": "file_missing"}]}]}))
    return path


def _advance(tmp_path, pre, q, manifest, patches, bench=None, *extra: str) -> list[str]:
    return ["advance", "--to", "0.33.0", "--preflight", str(pre), "--queue", str(q), "--manifest", str(manifest),
            "--patches", str(patches), "--pin-file", str(tmp_path / PIN_FILE_NAME),
            "--decisions", str(tmp_path / "sync-decisions.yaml"),
            "--benchmark-ref", str(bench or tmp_path / "bench-0.33.0.json"), *extra]


# ----------------------------------------------------------------------------- 1. evidence of another patch set


def test_pin_advance_refuses_a_preflight_and_manifest_of_another_set(tmp_path, gates_ok, capsys):
    pre, anchors, q = gates_ok
    sub_dir, gp_dir = _sets(tmp_path)
    sub, gp = load_patch_set(sub_dir), load_patch_set(gp_dir)
    pre.write_text(json.dumps({**GOOD_PREFLIGHT, "patch_set": {"directory": str(sub_dir), "patches": 1,
                                                               "digest": sub.digest()}}))
    os.utime(pre, (1_000_000, 1_000_000))
    manifest = _gp_manifest(anchors / "vllm-0.33.0.json", gp)
    rc = sndr_main(["pin", *(_advance(tmp_path, pre, q, manifest, gp_dir))])
    out = capsys.readouterr()
    assert rc == 1, out
    assert "pin advanced" not in out.out and not (tmp_path / PIN_FILE_NAME).exists()
    pre_line = next(line for line in out.out.splitlines() if line.startswith("gate preflight:"))
    assert "FAIL" in pre_line and sub.digest()[:12] in pre_line and gp.digest()[:12] in pre_line, pre_line
    man_line = next(line for line in out.out.splitlines() if line.startswith("gate manifest:"))
    assert "FAIL" in man_line and "GP1.e: file_missing" in man_line, man_line
    assert "failed gate(s): preflight, manifest" in out.err


def test_a_preflight_without_a_patch_set_digest_is_not_evidence(tmp_path, gates_ok, capsys):
    pre, anchors, q = gates_ok
    _, gp_dir = _sets(tmp_path)
    pre.write_text(json.dumps({k: v for k, v in GOOD_PREFLIGHT.items() if k != "patch_set"}))
    os.utime(pre, (1_000_000, 1_000_000))
    assert sndr_main(["pin", *(_advance(tmp_path, pre, q, anchors / "vllm-0.33.0.json", gp_dir))]) == 1
    assert "records no patch-set digest" in capsys.readouterr().out


def test_manifest_gate_fails_on_a_failing_verdict_of_an_enabled_patch(tmp_path):
    _, gp_dir = _sets(tmp_path)
    gp = load_patch_set(gp_dir)
    m = _gp_manifest(tmp_path / "vllm-0.33.0.json", gp)
    g = gate_manifest(m, "0.33.0", gp)
    assert not g.ok and "GP1.e: file_missing" in g.reason
    data = json.loads(m.read_text())
    data["patches"][0]["status"] = "gated"  # disabled on the target: its verdicts do not gate
    data["patches"][0]["edits"][0]["verdict"] = "gated"
    m.write_text(json.dumps(data))
    assert gate_manifest(m, "0.33.0", gp).ok
    data["patches"][0].update(status="partial", edits=[{"name": "e", "file": MISSING, "verdict": "drifted"}])
    m.write_text(json.dumps(data))
    assert "GP1.e: drifted" in gate_manifest(m, "0.33.0", gp).reason


def test_queue_gate_refuses_a_queue_planned_for_another_set(tmp_path, scripted, capsys):
    repo, tree, c = scripted
    sub_dir, gp_dir = _sets(tmp_path)
    q = tmp_path / "q.json"
    sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
              "--patches", str(sub_dir), "--json", str(q)])
    rep = load_queue(q)
    sub, gp = load_patch_set(sub_dir), load_patch_set(gp_dir)
    assert rep.patches_dir == str(sub_dir.resolve()) and rep.patch_set_digest == sub.digest()
    from sndr.upstream.decisions import load_decisions

    empty = load_decisions(tmp_path / "none.yaml").model
    g = gate_queue(rep, "main", empty, gp)
    assert not g.ok and "another patch set" in g.reason and sub.digest()[:12] in g.reason
    assert gp.digest()[:12] in g.reason
    assert "another patch set" not in gate_queue(rep, "main", empty, sub).reason


# ----------------------------------------------------------------------------- 2. the benchmark reference


@pytest.mark.parametrize("name,text,why", [
    ("bench.json", "", "is empty"),
    ("bench.json", "  \n", "is empty"),
    ("bench.json", "{}", "holds no measurement"),
    ("bench.json", '{"throughput": ', "is not valid JSON"),
    ("bench.md", "# Benchmark\n\nTODO\n", "holds no measurement"),
])
def test_benchmark_reference_must_hold_a_measurement(tmp_path, name, text, why):
    pre = tmp_path / "pre.json"
    pre.write_text("{}")
    os.utime(pre, (1_000_000, 1_000_000))
    bench = tmp_path / name
    bench.write_text(text)
    g = gate_benchmark(bench, pre)
    assert not g.ok and why in g.reason, g.reason


def test_benchmark_reference_forms_that_pass(tmp_path):
    for name, text in (("b.json", BENCH), ("b.json", "[{\"p50_ms\": 12}]"), ("b.md", "| tok/s | 1234 |\n"),
                       ("b.csv", "metric,value\ntok_s,1234\n")):
        bench = tmp_path / name
        bench.write_text(text)
        assert gate_benchmark(bench, None).ok, (name, text)


def test_pin_advance_refuses_an_empty_benchmark_reference(tmp_path, gates_ok, capsys):
    pre, anchors, q = gates_ok
    bench = tmp_path / "empty.json"
    bench.write_text("")
    (tmp_path / "empty_patches").mkdir()
    rc = sndr_main(["pin", *(_advance(tmp_path, pre, q, anchors / "vllm-0.33.0.json", tmp_path / "empty_patches", bench))])
    out = capsys.readouterr()
    assert rc == 1 and "gate benchmark: FAIL" in out.out and "is empty" in out.out
    assert not (tmp_path / PIN_FILE_NAME).exists()


# ----------------------------------------------------------------------------- 3. never write into shipped data


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """sndr as a non-editable install: <site-packages>/sndr/_data/patches is the shipped set."""
    import sndr.env as env

    pkg = tmp_path / "venv" / "lib" / "site-packages" / "sndr"
    data = pkg / "_data" / "patches"
    data.parent.mkdir(parents=True)
    _write_patch(data, "PN1", BLOCK_POOL, "        return ret\n")
    monkeypatch.setattr(env, "_package_dir", lambda: pkg)
    monkeypatch.delenv(env.PATCHES, raising=False)
    assert env.shipped_patches_dir() == data and env.is_shipped_data(data)
    return data


def test_is_shipped_data_is_the_installed_data_only(tmp_path, installed):
    from sndr.env import is_shipped_data

    assert is_shipped_data(installed / "sync-decisions.yaml") and is_shipped_data(installed.parent)
    assert is_shipped_data(Path("/opt/other-venv/lib/python3.12/site-packages/sndr/_data/patches/_pin.toml"))
    assert not is_shipped_data(tmp_path / "gp") and not is_shipped_data(installed.parent.parent)


def test_sync_decide_never_writes_into_the_installed_package(tmp_path, installed, scripted, capsys):
    repo, tree, c = scripted
    before = sorted(p.name for p in installed.iterdir())
    rc = sndr_main(["sync", "decide", c["conflict"], "--tier", "PORT-NOW", "--resolution", "not-needed covered"])
    err = capsys.readouterr().err
    assert rc == 2 and "shipped_data_write" in err and "--decisions FILE or --patches DIR" in err, err
    assert sorted(p.name for p in installed.iterdir()) == before
    # a queue planned with --patches gp: decide writes into gp, and a re-plan of gp shows it decided
    _, gp = _sets(tmp_path)
    _write_patch(gp, "PX0041", BLOCK_POOL, "        return ret\n")
    q = tmp_path / "q.json"
    sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
              "--patches", str(gp), "--json", str(q)])
    capsys.readouterr()
    assert sndr_main(["sync", "decide", c["conflict"][:10], "--queue", str(q), "--tier", "PORT-NOW",
                     "--resolution", "ported-as PX0041"]) == 0, capsys.readouterr().err
    assert (gp / "sync-decisions.yaml").is_file() and sorted(p.name for p in installed.iterdir()) == before
    sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "pin", "--to", "main", "--tree", str(tree),
              "--patches", str(gp), "--json", str(q)])
    assert "1 decided" in capsys.readouterr().out
    # deviations too
    assert sndr_main(["sync", "deviation", "PN1", "--why", "local", "--upstream", "vllm#1"]) == 2
    assert sndr_main(["sync", "deviation", "PX0041", "--why", "local", "--upstream", "vllm#1", "--patches", str(gp)]) == 0
    assert sorted(p.name for p in installed.iterdir()) == before


def test_pin_advance_and_manifest_build_never_write_into_the_installed_package(tmp_path, installed, gates_ok,
                                                                              capsys):
    pre, anchors, q = gates_ok
    args = ["advance", "--to", "0.33.0", "--preflight", str(pre), "--queue", str(q), "--manifest",
            str(anchors / "vllm-0.33.0.json"), "--benchmark-ref", str(tmp_path / "bench-0.33.0.json")]
    assert sndr_main(["pin", *args]) == 2
    err = capsys.readouterr().err
    assert "shipped_data_write" in err and "--patches DIR (or --pin-file PATH)" in err, err
    assert sndr_main(["pin", *args, "--pin-file", str(installed / PIN_FILE_NAME)]) == 2
    assert not (installed / PIN_FILE_NAME).exists()
    assert sndr_main(["pin", "show"]) == 0  # reading the shipped set is fine: no pin recorded there
    out = capsys.readouterr().out
    assert str(installed / PIN_FILE_NAME) in out and "the pin is sndr's own, vllm 0.32.0" in out, out

    assert sndr_main(["manifest", "build", "--tree", str(tmp_path), "--patches", str(installed)]) == 2
    assert "shipped_data_write" in capsys.readouterr().err


def test_watchlist_set_never_writes_into_the_installed_package(tmp_path, installed, capsys):
    """``watchlist set`` edited ``<site-packages>/sndr/_data/patches/watchlist.yaml`` of a pip-installed
    sndr in place (found on a fresh ``pip install .``): a reinstall loses the edit. Refused like ``sync
    decide`` and ``pin advance``; ``--dry-run``, ``show`` and ``lint`` still read it, and a watchlist the
    operator keeps is edited."""
    shutil.copy(Path(__file__).resolve().parents[2] / "patches" / "watchlist.yaml", installed / "watchlist.yaml")
    before = (installed / "watchlist.yaml").read_bytes()
    assert sndr_main(["watchlist", "set", "vllm#52412", "status", "merged"]) == 2
    err = capsys.readouterr().err
    assert "shipped_data_write" in err and "--watchlist PATH" in err, err
    assert (installed / "watchlist.yaml").read_bytes() == before
    assert sndr_main(["watchlist", "set", "vllm#52412", "status", "merged", "--dry-run"]) == 0
    assert "+  status: merged" in capsys.readouterr().out
    assert (installed / "watchlist.yaml").read_bytes() == before
    assert sndr_main(["watchlist", "show", "vllm#52412"]) == 0
    capsys.readouterr()
    kept = tmp_path / "watchlist.yaml"
    kept.write_bytes(before)
    assert sndr_main(["watchlist", "--watchlist", str(kept), "set", "vllm#52412", "status", "merged"]) == 0
    assert "status: merged" in kept.read_text() and (installed / "watchlist.yaml").read_bytes() == before


# ----------------------------------------------------------------------------- 4. the small ones


def test_sync_plan_warns_when_the_range_runs_backwards(releases, tmp_path, capsys):
    repo, tree, c = releases
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PN1", BLOCK_POOL, "        return ret\n")
    q, md = tmp_path / "q.json", tmp_path / "q.md"
    sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "v0.33.0", "--to", "v0.32.0", "--tree", str(tree),
              "--patches", str(pdir), "--json", str(q), "--md", str(md)])
    err = capsys.readouterr().err
    assert "warning: the range runs backwards: --to v0.32.0" in err and "mostly the pin's own side" in err, err
    warnings = json.loads(q.read_text())["warnings"]
    # the third: the tree (v0.32.0's content) looks like --to, not like --from, the pin the command names
    assert len(warnings) == 3 and "## Warnings" in md.read_text()
    assert "looks like --to v0.32.0, not the pin" in warnings[0]
    sndr_main(["sync", "plan", "--repo", str(repo.path), "--from", "v0.32.0", "--to", "v0.33.0", "--tree", str(tree),
              "--patches", str(pdir), "--json", str(q)])
    assert "warning" not in capsys.readouterr().err and json.loads(q.read_text())["warnings"] == []


def test_decide_refuses_a_ported_as_of_an_unknown_patch(tmp_path, scripted, capsys):
    c = scripted[2]
    pdir = tmp_path / "patches"
    _write_patch(pdir, "PX0040", BLOCK_POOL, "        return ret\n")
    dfile = tmp_path / "d.yaml"
    base = ["decide", c["conflict"], "--patches", str(pdir), "--decisions", str(dfile)]
    assert sndr_main(["sync", *base, "--resolution", "ported-as PX0041"]) == 2
    err = capsys.readouterr().err
    assert "unknown_id" in err and "PX0040" in err and "--allow-unknown" in err, err
    assert not dfile.exists()
    assert sndr_main(["sync", *base, "--resolution", "ported-as PX0041", "--allow-unknown"]) == 0
    assert sndr_main(["sync", *base, "--resolution", "ported-as PX0040"]) == 0


def test_the_rebuild_hint_never_names_the_installed_anchors(tmp_path, installed):
    """pin advance with the default anchors of an installed sndr: the hint said `manifest build ... --out
    <site-packages>/sndr/_data/anchors/vllm-0.33.0.json`, which manifest build refuses (shipped_data_write).
    It names a file of the caller's and the --manifest that reads it."""
    from sndr.__main__ import build_parser

    shipped = installed.parent / "anchors" / "vllm-0.33.0.json"
    hint = rebuild_hint(shipped, "0.33.0")
    assert "_data" not in hint and hint.endswith("--out vllm-0.33.0.json, then pass --manifest vllm-0.33.0.json "
                                                 "to pin advance"), hint
    argv = shlex.split(hint.split(",", 1)[0])
    args = build_parser(argv[3:]).parse_args(argv[3:])
    assert str(args.out) == "vllm-0.33.0.json"
    assert rebuild_hint(tmp_path / "anchors" / "vllm-0.33.0.json", "0.33.0").endswith(
        f"--out {tmp_path / 'anchors' / 'vllm-0.33.0.json'}")


def test_manifest_rebuild_hint_is_a_runnable_command(tmp_path):
    from sndr.__main__ import build_parser

    pdir = tmp_path / "gp"
    _write_patch(pdir, "GP1", BLOCK_POOL, "        return ret\n")
    ps = load_patch_set(pdir)
    g = gate_manifest(tmp_path / "anchors" / "vllm-0.33.0.json", "0.33.0", ps)
    assert not g.ok and rebuild_hint(tmp_path / "anchors" / "vllm-0.33.0.json", "0.33.0", ps) in g.reason
    cmd = g.reason.split("(", 1)[1].rsplit(")", 1)[0]
    argv = shlex.split(cmd)
    assert argv[:4] == ["python", "-m", "sndr", "manifest"]
    args = build_parser(argv[3:]).parse_args(argv[3:])
    assert (args.cmd, args.tree, args.patches, args.out) == (
        "build", "vllm==0.33.0", pdir, tmp_path / "anchors" / "vllm-0.33.0.json")
