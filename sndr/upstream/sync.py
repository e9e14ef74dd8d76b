"""``python -m sndr sync plan|decide|deviation``: the upstream port queue, and the public names of the sync cycle.

The work lives in cohesive modules under :mod:`sndr.upstream`:

- :mod:`~sndr.upstream.gitio`: git access, batched (range, changes, patch-ids, blobs);
- :mod:`~sndr.upstream.diff`: the one unified-diff parser (also used by ``vendor``);
- :mod:`~sndr.upstream.judge`: one change judged on the simulated tree;
- :mod:`~sndr.upstream.lines`: line ownership through the range (dependencies, net-zero, superseded);
- :mod:`~sndr.upstream.reverts`: revert pairing in vLLM's squash-merge forms, and chains;
- :mod:`~sndr.upstream.queue` and :mod:`~sndr.upstream.report`: the planner and its report;
- :mod:`~sndr.upstream.treecheck`: whether the tree judged on is the pin;
- :mod:`~sndr.upstream.decisions`: kept decisions and deviations (``patches/sync-decisions.yaml``);
- :mod:`~sndr.upstream.pin`: the pin record and the gates of ``pin advance``.

This module is the CLI of ``sync`` and keeps the names that callers imported
from it before the split.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, bad_input
from ..pinrecord import PIN_FILE_NAME, PinRecord, default_pin_path, read_pin
from .decisions import (
    DECISIONS_NAME,
    Decision,
    Decisions,
    Deviation,
    default_decisions_path,
    drop_deviation,
    load_decisions,
    set_decision,
    set_deviation,
)
from .diff import Hunk, parse_hunks
from .gates import PinGate, target_problem
from .gitio import EMPTY_TREE, CommitInfo, Git, GitFileChange
from .judge import FUZZ_MIN_CHARS, FileResult, HunkResult, SimTree, classify_change, classify_hunk
from .lines import LineTracker, net_zero, superseded
from .pin import advance, gate_benchmark, gate_deviations, gate_manifest, gate_preflight, gate_queue
from .queue import SYNC_CONFIG_NAME, Surface, load_sync_config, patch_surface, plan_queue
from .report import QUEUED, CommitEntry, Disposition, QueueReport, QueueStatus, Wave, render_markdown
from .reverts import pair_reverts

__all__ = [
    "DECISIONS_NAME", "EMPTY_TREE", "FUZZ_MIN_CHARS", "PIN_FILE_NAME", "QUEUED", "SYNC_CONFIG_NAME", "CommitEntry",
    "CommitInfo", "Decision", "Decisions", "Deviation", "Disposition", "GitFileChange", "FileResult", "PinGate", "Git",
    "Hunk", "HunkResult", "LineTracker", "PinRecord", "QueueReport", "QueueStatus", "SimTree", "Surface", "Wave",
    "advance", "classify_change", "classify_hunk", "default_decisions_path", "default_pin_path",
    "gate_benchmark", "gate_deviations", "gate_manifest", "gate_preflight", "gate_queue", "load_decisions",
    "load_sync_config", "net_zero", "pair_reverts", "parse_hunks", "patch_surface", "plan_queue", "read_pin",
    "render_markdown", "superseded",
]


def run_sync(args) -> int:
    """``sndr sync plan|decide|deviation`` (its options: :mod:`sndr.commands.sync`)."""
    if args.cmd == "plan":
        return _plan_cmd(args)
    from ..cli import write_output
    from ..env import patches_dir, refuse_shipped_write, writable_patches_dir
    from .decisions import EMPTY, parse_decisions
    from .watchlist import read_text_file

    rep = None
    if args.cmd == "decide" and args.queue:
        from .pin import load_queue

        rep = load_queue(Path(args.queue))
    # the patch dir: --patches, else the one the queue was planned for, else $SNDR_PATCHES (or the shipped set)
    pdir = Path(args.patches) if args.patches else Path(rep.patches_dir) if rep and rep.patches_dir else None
    if args.decisions:
        path = Path(args.decisions)
        refuse_shipped_write(path, flag="--decisions FILE")
    else:
        path = writable_patches_dir(pdir, flag="--decisions FILE or --patches DIR") / DECISIONS_NAME
    text = read_text_file(path, "decisions file") if path.exists() else EMPTY
    if args.cmd == "decide":
        if args.from_file:
            return _decide_batch(args, rep, path, text, pdir)
        if args.sha is None:
            raise bad_input("usage", "name the commit (SHA), or pass --from-file FILE")
        sha, subject = _resolve_sha(args.sha, rep, args.queue, args.repo, text)
        if not (args.tier or args.resolution or args.note):
            raise bad_input("usage", "say what to record: --tier, --resolution and/or --note")
        ported = (args.resolution or "").strip()
        if ported.startswith("ported-as ") and not args.allow_unknown:
            _check_ported_as(ported.split(" ", 1)[1].strip(), pdir or patches_dir())
        new, d = set_decision(text, sha, str(path), subject=subject, tier=args.tier,
                              resolution=args.resolution, note=args.note)
        write_output(path, new, "the decisions file")
        print(f"{path}: {d.sha[:10]}: {d.summary() or 'recorded'}")
        return EXIT_OK
    if args.drop:
        new = drop_deviation(text, args.patch, str(path))
        write_output(path, new, "the decisions file")
        print(f"{path}: deviation {args.patch} dropped")
        return EXIT_OK
    paths = [p.strip() for p in args.paths.split(",") if p.strip()] if args.paths else None
    if args.reviewed is not None and (why := target_problem(args.reviewed)) is not None:
        raise bad_input("usage", f"--reviewed {args.reviewed!r}: {why}", key="reviewed",
                        hint="the target the deviation was reviewed for, as pin advance --to names it")
    if not args.allow_unknown:
        _check_patch_id(args.patch, pdir or patches_dir(), "deviation", key="patch",
                        escape="--allow-unknown (with --paths) for a patch not written yet")
    elif not paths and not ((old := parse_decisions(text, str(path)).model.deviation(args.patch)) and old.paths):
        raise bad_input("usage", f"deviation {args.patch}: --allow-unknown needs --paths FILE,...: without the "
                        "patch's files the deviation lives in no file, and no report or gate would show it",
                        key="paths")
    new = set_deviation(text, args.patch, str(path), upstream=args.upstream, why=args.why,
                        discharge=args.discharge, paths=paths, reviewed=args.reviewed)
    write_output(path, new, "the decisions file")
    dev = load_decisions(path).model.deviation(args.patch)
    assert dev is not None  # set_deviation has just written it
    print(f"{path}: deviation {args.patch}: " + ", ".join(f"{k}={v}" for k, v in dev.model_dump(
        exclude_none=True, exclude_defaults=True).items() if k != "patch"))
    return EXIT_OK


def _check_ported_as(pid: str, pdir: Path) -> None:
    """``ported-as PID`` names a patch of the set in ``pdir`` (``unknown_id``, exit 2, otherwise)."""
    _check_patch_id(pid, pdir, "ported-as", key="resolution",
                    escape="--allow-unknown if the port is not written yet")


def _check_patch_id(pid: str, pdir: Path, what: str, *, key: str, escape: str) -> None:
    """``pid`` names a patch of the set in ``pdir`` (``unknown_id``, exit 2, otherwise)."""
    from ..load import load_patch_set

    ids = sorted(p.id for p in load_patch_set(pdir).patches)
    if pid in ids:
        return
    import difflib

    close = difflib.get_close_matches(pid, ids, n=3)
    raise bad_input("unknown_id", f"{what} {pid}: no patch {pid} in {pdir}", key=key,
                    hint=(f"did you mean {', '.join(close)}? " if close else "")
                    + (f"known ids: {', '.join(ids[:12])}{' ...' if len(ids) > 12 else ''}; " if ids else "")
                    + f"pass --patches DIR for another set, or {escape}")


def _resolve_sha(raw: str, rep, queue: str | None, repo: str | None, text: str) -> tuple[str, str | None]:
    """The full sha (and subject) ``raw`` names: in the queue report, else in ``repo``, else a decision the file
    already has; refused (exit 2) when it is not hex, too short, or names no commit or several."""
    import re

    from .decisions import SHA_PATTERN, parse_decisions

    sha = raw.strip().lower()
    if not re.fullmatch(r"[0-9a-f]+", sha):
        raise bad_input("bad_select", f"{raw!r} is not a commit sha (hex digits)", key="sha")
    if not re.fullmatch(SHA_PATTERN, sha):
        raise bad_input("bad_select", f"{raw!r} is too short to name a commit: give 7 to 40 hex digits"
                        if len(sha) < 7 else f"{raw!r} is longer than a sha (40 hex digits)", key="sha")
    if rep is not None:
        hits = [c for c in rep.commits if c.sha.startswith(sha)]
        if len(hits) != 1:
            raise bad_input("bad_select", f"{raw!r} names {'no' if not hits else 'more than one'} commit "
                            f"of {queue}", key="sha")
        return hits[0].sha, hits[0].subject
    if repo is not None:
        from .gitio import Git

        git = Git(repo)
        try:
            proc = git.run("rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}", check=False)
            if proc.returncode != 0:
                many = git.run("rev-parse", "--disambiguate=" + sha, check=False).stdout.split()
                raise bad_input("bad_select", f"{raw!r} names {'more than one' if len(many) > 1 else 'no'} commit "
                                f"in {repo}", key="sha")
            full = proc.stdout.decode().strip()
            return full, git.text("log", "-1", "--format=%s", full).strip() or None
        finally:
            git.close()
    known = [d.sha for d in parse_decisions(text).model.decisions if d.sha.startswith(sha) or sha.startswith(d.sha)]
    if len(known) == 1 or len(sha) == 40:
        return (sha if len(sha) >= len(known[0] if known else "") else known[0]), None
    raise bad_input("bad_select", f"{raw!r} names {'more than one' if known else 'no'} commit of the decisions file, "
                    "and there is nothing to check a new one against", key="sha",
                    hint="pass --queue QUEUE.json (from `sync plan --json`) or --repo REPO, or the full 40-digit sha")


def _decide_batch(args, rep, path: Path, text: str, pdir: Path | None) -> int:
    """``decide --from-file FILE``: every row checked before any is written; the decisions file written once."""
    from ..cli import write_output
    from ..env import patches_dir
    from ..errors import Problem, SndrError
    from .watchlist import read_text_file
    from .yamledit import load_rt, to_plain

    if args.sha or args.tier or args.resolution or args.note:
        raise bad_input("usage", "--from-file takes the rows from the file: no SHA, --tier, --resolution or --note")
    src = str(args.from_file)
    raw = load_rt(read_text_file(Path(args.from_file), "decisions batch"), src)
    rows = to_plain(raw)
    if not isinstance(rows, list) or not rows:
        raise bad_input("bad_decisions", "a decisions batch is a non-empty YAML list of rows "
                        "(- sha: ..., tier: ..., resolution: ..., note: ...)", file=src, line=1)
    problems: list[Problem] = []
    new = text
    done = []
    for k, row in enumerate(rows):
        line = raw.lc.item(k)[0] + 1 if hasattr(raw, "lc") else None
        try:
            if not isinstance(row, dict) or set(row) - {"sha", "subject", "tier", "resolution", "note"} \
                    or "sha" not in row:
                raise bad_input("bad_decisions", "a row is a mapping with sha and tier, resolution and/or note "
                                f"(got {row!r})")
            sha, subject = _resolve_sha(str(row["sha"]), rep, args.queue, args.repo, new)
            ported = str(row.get("resolution") or "").strip()
            if ported.startswith("ported-as ") and not args.allow_unknown:
                _check_ported_as(ported.split(" ", 1)[1].strip(), pdir or patches_dir())
            if not any(row.get(key) for key in ("tier", "resolution", "note")):
                raise bad_input("usage", "say what to record: tier, resolution and/or note")
            new, d = set_decision(new, sha, str(path), subject=subject or row.get("subject"), tier=row.get("tier"),
                                  resolution=row.get("resolution"), note=row.get("note"))
            done.append(d)
        except SndrError as exc:
            for p in exc.problems:
                at = line
                try:  # the line of the key the problem names, when the row has it
                    at = raw[k].lc.key(p.key)[0] + 1 if p.key and p.key in raw[k] else line
                except (AttributeError, KeyError, TypeError, IndexError):
                    pass
                problems.append(Problem(p.code, f"row {k + 1}: {p.message}", file=src, line=at, key=p.key,
                                        hint=p.hint))
    if problems:
        raise SndrError(problems)
    write_output(path, new, "the decisions file")
    for d in done:
        print(f"{path}: {d.sha[:10]}: {d.summary() or 'recorded'}")
    print(f"{path}: {len(done)} decision(s) recorded from {src}")
    return EXIT_OK


def _range_warnings(rep: QueueReport) -> list[str]:
    """A range that runs backwards: --to's version sorts before --from's, or the range is mostly the pin's side."""
    import re

    from packaging.version import InvalidVersion, Version

    def version(ref: str) -> Version | None:
        m = re.search(r"v?(\d+(?:\.\d+)+[0-9A-Za-z.+-]*)$", ref)
        try:
            return Version(m.group(1)) if m else None
        except InvalidVersion:
            return None

    out = []
    vf, vt = version(rep.from_ref), version(rep.to_ref)
    if vf is not None and vt is not None and vt < vf:
        out.append(f"the range runs backwards: --to {rep.to_ref} ({vt}) sorts before --from {rep.from_ref} ({vf}); "
                   f"did you mean --from {rep.to_ref} --to {rep.from_ref}?")
    n = rep.counts.get("commits", len(rep.commits))
    if not rep.from_is_ancestor and len(rep.pin_side) > n:
        out.append(f"the range is mostly the pin's own side: {len(rep.pin_side)} commit(s) reachable from --from "
                   f"{rep.from_ref} and not from --to {rep.to_ref}, against {n} in {rep.from_ref}..{rep.to_ref}; "
                   "check that --from is the pin and --to the target")
    return out


def _plan_cmd(args) -> int:
    from ..cli import check_output
    from ..load import load_patch_set

    if args.json == "-" and args.md == "-":  # one stdout: the Markdown was silently dropped
        raise bad_input("stdout_conflict", "--json - and --md - would both write to stdout", key="--md",
                        hint="send one of them to a file")
    for flag, dest in (("--json", args.json), ("--md", args.md)):
        if dest:
            check_output(dest, flag)  # before any work: a refused output path changes nothing
    ps = load_patch_set(args.patches)
    globs = list(args.surface)
    config = Path(args.config) if args.config else (Path(ps.directory) / SYNC_CONFIG_NAME if ps.directory else None)
    if config is not None and (args.config or config.exists()):
        globs += load_sync_config(config)
    surface = Surface(patch_surface(ps.patches), globs)
    dpath = Path(args.decisions) if args.decisions else (
        Path(ps.directory) / DECISIONS_NAME if ps.directory else default_decisions_path())
    decisions = load_decisions(dpath, missing_ok=not args.decisions).model
    patch_files = {p.id: [f.path for f in getattr(p, "files", []) or []] for p in ps.patches}
    tree = None
    if args.tree:
        from ..tree import open_tree

        tree = open_tree(args.tree)
    from .judge import local_marks

    pin = read_pin(default_pin_path(ps.directory)) if ps.directory else None
    select = [s for s in args.select.split(",") if s.strip()] if args.select else None
    rep = plan_queue(args.repo, args.from_ref, args.to_ref, surface, tree, select=select, decisions=decisions,
               patch_files=patch_files, decisions_file=str(dpath) if dpath.exists() else None,
               local=local_marks(ps.patches), pin_version=pin.version if pin else None,
               pin_digest=pin.tree_digest if pin else None)
    rep.patches_dir = str(Path(ps.directory).resolve()) if ps.directory else None
    rep.patch_set_digest = ps.digest()
    rep.warnings += _range_warnings(rep)
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    text_json = rep.model_dump_json(indent=2)
    text_md = render_markdown(rep)
    from ..cli import write_output

    if args.json:
        write_output(args.json, text_json + "\n", "--json")
    if args.md and args.md != "-":
        write_output(args.md, text_md + "\n", "--md")
    c = rep.counts
    summary = (f"{c.get('commits', 0)} commits in {args.from_ref}..{args.to_ref} (merge-base "
               f"{(rep.merge_base or '')[:10]}), {c.get('mirrored', 0)} on the surface: {c.get('queued', 0)} queued "
               f"in {len(rep.waves)} wave(s), {c.get('decided', 0)} decided, {c.get('undecided', 0)} undecided"
               + (f"; {c['blocked']} blocked by a by-hand commit" if c.get("blocked") else ""))
    if args.json == "-":
        print(summary, file=sys.stderr)
    elif args.md == "-" or not (args.json or args.md):
        write_output("-", text_md + "\n", "--md")
    else:
        print(summary)
    return EXIT_FINDINGS if (c.get("undecided", 0) or rep.findings) else EXIT_OK
