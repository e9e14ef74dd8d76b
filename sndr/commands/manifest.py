"""``python -m sndr manifest build|check``: anchors/vllm-<version>.json (the engine: :mod:`sndr.manifest`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import path_text, path_value

HELP = "Build or check anchors/vllm-<version>.json."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write anchors/vllm-<version>.json for a pristine tree (a tree sndr patched is "
                                     "read through its pristine copies in .sndr/objects)")
    b.add_argument("--tree", type=path_text, help="vllm==X, a directory, a .whl, git:REPO@REV (default: the pin of the one committed "
                                  "manifest)")
    b.add_argument("--patches", type=path_value, help="patch directory (default: the shipped set)")
    b.add_argument("--out", type=path_value, help="output directory (vllm-<version>.json is written into it; made if "
                                            "missing, never a symlink), a FILE.json, or - for stdout (default: "
                                            "the shipped anchors/)")
    c = sub.add_parser("check", help="exit 1 when a committed manifest does not match the patch set and pin")
    c.add_argument("--tree", type=path_text, help="tree to check against (default: the pin of every committed manifest)")
    c.add_argument("--patches", type=path_value, help="patch directory (default: the shipped set)")
    c.add_argument("--anchors", type=path_value, help="the directory that holds the manifests, each named "
                                                "vllm-<version>.json (a manifest file itself is refused; default: "
                                                "the shipped anchors/)")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:  # the engine is imported inside: an import failure is the boundary's exit 3 and line
        return _build(args) if args.cmd == "build" else _check(args)

    return boundary("sndr manifest", body,
                    on_interrupt=lambda: "a manifest is written atomically: the old one or the new one is in place")


def _check(args: argparse.Namespace) -> int:
    import sys

    from ..errors import EXIT_OK
    from ..load import shipped_anchors_dir
    from ..manifest import check

    code, lines = check(args.tree, args.patches, args.anchors or shipped_anchors_dir())
    print("\n".join(lines), file=sys.stdout if code == EXIT_OK else sys.stderr)
    return code


def _build(args: argparse.Namespace) -> int:
    import sys

    from ..cli import check_output
    from ..env import refuse_shipped_write
    from ..errors import EXIT_FINDINGS, EXIT_OK, bad_input
    from ..load import load_patch_set, shipped_anchors_dir
    from ..manifest import build_manifest, counts, failing_edits, manifest_name, out_is_file, pin_trees, write_manifest
    from ..tree import open_tree

    out = args.out or shipped_anchors_dir()
    to_stdout = str(out) == "-"  # '-' is stdout, as for every output (sndr.cli.write_output)
    if not to_stdout:
        refuse_shipped_write(out, flag="--out DIR")  # never into an installed sndr's shipped anchors
    to_file = to_stdout or out_is_file(out)  # refuses an --out that is neither a directory nor a .json file
    if not to_stdout:
        # before any work: a FILE.json or the DIR it goes into, never a symlink, FIFO, device or read-only place
        check_output(out, "--out", directory=not to_file)
    spec = args.tree
    if spec is None:
        pins = pin_trees(shipped_anchors_dir() if to_stdout else out.parent if to_file else out, None, "--out")
        if len(pins) != 1:
            raise bad_input("tree_required", f"--tree is required ({len(pins)} manifests in {out})", key="--tree",
                            hint="e.g. --tree vllm==0.32.0")
        spec = pins[0]
    patch_set = load_patch_set(args.patches)
    notes: list[str] = []
    with open_tree(spec) as tree:
        if not to_file:  # the file's name is known now: what is there must be replaceable before the build
            check_output(out / manifest_name(tree.version), "--out")
        manifest = build_manifest(tree, patch_set, notes)
    path = write_manifest(manifest, out)
    for line in notes:  # how it was read, when not as the tree is (said before the result line)
        print(f"note: {line}", file=sys.stderr if to_stdout else sys.stdout)
    failing = failing_edits(manifest)
    print(f"wrote {'stdout' if to_stdout else path} ({counts(manifest)}; vllm {manifest.vllm_version}, "
          f"tree {manifest.tree_digest[:12]})", file=sys.stderr if to_stdout else sys.stdout)
    pin = _pin_version(patch_set.directory or None)
    on = "on the pin" if _same_release(manifest.vllm_version, pin) else \
        f"on vllm {manifest.vllm_version} (a target tree, not the pin {pin})"
    for pid, name, verdict in failing:
        print(f"  {pid}.{name}: {verdict} {on}", file=sys.stderr)
    return EXIT_FINDINGS if failing else EXIT_OK


def _pin_version(patches: Path | None) -> str:
    """The pin the patch set is validated on: its pin record's version, else sndr's pinned vLLM."""
    from ..pinrecord import pin_version

    return pin_version(patches)[0]


def _same_release(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a).public == Version(b).public
    except InvalidVersion:
        return a == b
