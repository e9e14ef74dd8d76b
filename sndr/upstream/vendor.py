"""``python -m sndr vendor``: turn a unified diff into a patch file.

Operators write most patches by backporting an upstream change onto their
pin. ``vendor`` reads the change as a unified diff (``git format-patch``,
``git diff`` or ``diff -u``) and writes one patch TOML:

* every hunk becomes one edit. Its anchor is the hunk's changed lines,
  widened with lines of the pin's file around them until the anchor occurs
  exactly once; its replacement is the post-image with the same widening.
  Hunks are placed the way the planner applies edits: hunk *k* is located in
  the text that hunks 1..k-1 left;
* each edit gets a merged marker: the shortest characteristic added line (or
  pair of adjacent lines) that is absent from the pin's whole file;
* new files become ``create`` entries; deleted and renamed files are refused.

Check everything, then touch anything: before a file is written, the patch
is planned on the pin with :func:`sndr.plan.build_plan` and must reproduce
the diff's post-image byte for byte, and planned on that post-image, where
every edit must read ``applied`` or ``merged``.

The work is a pure function, :func:`vendor_diff`, of the diff text and a
reader of the pin's files; the CLI around it is thin. Its steps live in
:mod:`.vendor_place` (read the diff, place the hunks), :mod:`.vendor_anchor`
(markers, widening, names) and :mod:`.vendor_check` (the result and the plan
checks); the round trip of one file is here, next to the function it drives.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from ..errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, Problem, SndrError, registered_exit
from ..load import PatchSet
from ..locate import scopes
from ..model import ID_PATTERN, Edit, FileEdits, Patch, Verdict
from ..plan import Reader
from .defaults import DEFAULT_FUZZ, DEFAULT_MAX_CONTEXT  # their one home: stdlib only, read by the parser
from .diff import DiffFile
from .vendor_anchor import WORD, choose_marker, edit_name, slug, widen
from .vendor_check import EditReport, Skip, VendorResult, verify
from .vendor_place import DiffHunk, parse_diff, place, resolve_path, split_lines, to_pin_line, unified_diff

_PACKAGE = "vllm/"

__all__ = [
    "DEFAULT_MAX_CONTEXT",
    "EditReport",
    "VendorResult",
    "run_vendor",
    "parse_diff",
    "roundtrip_file",
    "roundtrip_result",
    "split_lines",
    "unified_diff",
    "vendor_diff",
]


# ----------------------------------------------------------------------------- the pure core


def _match(path: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, g) for g in globs)


def vendor_diff(diff_text: str, read: Reader, *, patch_id: str, title: str | None = None,
                upstream: list[str] | None = None, markers: dict[str, list[str]] | None = None,
                version: str = "", vllm_spec: str = "", description: str | None = None,
                max_context: int = DEFAULT_MAX_CONTEXT, fuzz: int = DEFAULT_FUZZ, strip: int | None = None,
                include: Iterable[str] = (), exclude: Iterable[str] = (), check_compile: bool = True,
                source: str = "diff", header: list[str] | None = None,
                after: list[str] | None = None, diff_path: str | None = None) -> VendorResult:
    """Turn ``diff_text`` into a patch for the tree ``read`` serves. Pure: reads through ``read`` only.

    ``markers`` maps an edit name, or a hunk number counted across the whole
    diff (``"3"``), to merged markers the author chose. Nothing is returned
    in ``text`` unless every hunk was vendored and the plan checks passed. ``diff_path``: the file the
    diff was read from, named by a problem with the diff itself.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    skipped: list[Skip] = []
    reports: list[EditReport] = []
    created: list[str] = []
    markers = dict(markers or {})
    include, exclude = list(include), list(exclude)

    def fail(code: int) -> VendorResult:
        return VendorResult(None, None, reports, created, skipped, problems, warnings, code)

    if not re.match(ID_PATTERN, patch_id or ""):
        problems.append(Problem("bad_id", f"{patch_id!r} is not a patch id (letters, digits, _ and -, starting "
                                "with a letter)", key="--id"))
        return fail(EXIT_BAD_INPUT)
    try:
        files, meta = parse_diff(diff_text)
    except SndrError as exc:
        import dataclasses

        problems.extend(dataclasses.replace(p, file=diff_path) if p.file is None and diff_path else p
                        for p in exc.problems)
        return fail(EXIT_BAD_INPUT)
    if vllm_spec:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            excluded = bool(version) and not SpecifierSet(vllm_spec).contains(version, prereleases=True)
        except InvalidSpecifier:
            problems.append(Problem("bad_vllm_spec", f"{vllm_spec!r} is not a PEP 440 specifier", key="--vllm"))
            return fail(EXIT_BAD_INPUT)
        if excluded:
            problems.append(Problem("bad_vllm_spec", f"{vllm_spec!r} excludes the pin's version {version}: the "
                                    "patch would never be enabled on the tree it is vendored for", key="--vllm"))
            return fail(EXIT_BAD_INPUT)
    title = title or meta.get("subject")
    if not title:
        problems.append(Problem("no_title", "the patch needs a title and the diff has no Subject: line", key="--title"))
        return fail(EXIT_BAD_INPUT)
    if upstream is None:
        upstream = [f"vllm#{meta['pr']}"] if "pr" in meta else []

    texts: dict[str, str | None] = {}

    def pin(rel: str) -> str | None:
        if rel not in texts:
            texts[rel] = read(rel)
        return texts[rel]

    # Group the diff by target file, keeping the order of first appearance; a
    # file named twice (a format-patch series) gets its hunks in rounds.
    order: list[str] = []
    by_path: dict[str, list[tuple[int, DiffFile[DiffHunk]]]] = {}
    for rnd, df in enumerate(files):
        path = resolve_path(df, lambda p: _safe_exists(pin, p), strip)
        if include and not _match(path, include):
            skipped.append(Skip(path, "not_included", "not matched by --include"))
            continue
        if exclude and _match(path, exclude):
            skipped.append(Skip(path, "excluded", "excluded by --exclude"))
            continue
        if not path.startswith(_PACKAGE):
            skipped.append(Skip(path, "outside_package",
                                "outside vllm/ (not part of an installed vLLM; tests and docs are not shipped)"))
            continue
        if path not in by_path:
            order.append(path)
            by_path[path] = []
        by_path[path].append((rnd, df))

    file_entries: list[FileEdits] = []
    expected: dict[str, str] = {}
    used_names: set[str] = set()
    comments: dict[str, str] = {}
    hunk_no = 0
    numbered: list[tuple[int, str]] = []  # global hunk number -> edit name
    for path in order:
        entries = by_path[path]
        statuses = {df.status for _, df in entries}
        if "binary" in statuses:
            problems.append(Problem("binary_file", "binary change: sndr patches text only", file=path))
            continue
        if "renamed" in statuses:
            problems.append(Problem("renamed_file", "renamed file refused: a patch can create the new path but "
                                    "never removes the old module, which the pin would go on importing",
                                    file=path, hint="vendor the new file as a creation (a diff against /dev/null) "
                                    "and keep the old one, or exclude it with --exclude"))
            continue
        if "deleted" in statuses:
            problems.append(Problem("deleted_file", "deleted file refused: sndr edits and creates files but never "
                                    "deletes them (a deletion cannot be verified, reverted by anchor, or told apart "
                                    "from a missing file on the next pin)", file=path,
                                    hint="disable the module's callers with edits instead, or drop it from the diff "
                                    "with --exclude"))
            continue
        try:
            pin_text = pin(path)
        except SndrError as exc:
            problems.extend(exc.problems)
            continue
        hunks = [(rnd, h) for rnd, df in entries for h in df.hunks]
        if not hunks:
            skipped.append(Skip(path, "metadata_only", "no content change (mode or metadata only)"))
            continue
        numbers = list(range(hunk_no + 1, hunk_no + 1 + len(hunks)))
        hunk_no += len(hunks)
        if entries[0][1].status == "added":
            if pin_text is not None:
                problems.append(Problem("create_exists", "the diff creates this file, but the pin already has it",
                                        file=path, hint="the diff is not against this pin"))
                continue
            _, content_lines, probs = place(path, [h for _, h in hunks], [], fuzz, numbers,
                                                  [r for r, _ in hunks])
            problems.extend(probs)
            content = "".join(content_lines)
            if probs:
                continue
            if not content:
                problems.append(Problem("create_empty", "the diff creates an empty file; a create entry needs content",
                                        file=path, hint="give the file a one-line comment upstream-style, or "
                                        "exclude it with --exclude"))
                continue
            file_entries.append(FileEdits(path=path, create=content))
            expected[path] = content
            created.append(path)
            continue
        if pin_text is None:
            problems.append(Problem("file_missing", "the diff changes a file that the pin does not have",
                                    file=path, hint="the diff is not against this pin, or the file is new upstream"))
            continue
        pin_lines = split_lines(pin_text)
        placed, post_lines, probs = place(path, [h for _, h in hunks], pin_lines, fuzz, numbers,
                                           [r for r, _ in hunks])
        problems.extend(probs)
        if probs:
            continue
        post_text = "".join(post_lines)
        if not post_text:
            problems.append(Problem("file_emptied", "the diff empties this file; an edit cannot leave nothing behind "
                                    "(its replacement must not be empty)", file=path,
                                    hint="keep a line (a comment saying why the module is empty) in the change"))
            continue
        sc = scopes(pin_text)
        pin_words = set(WORD.findall(pin_text))
        history: list[tuple[int, int, int]] = []
        edits: list[Edit] = []
        file_ok = True
        for pl in placed:
            prior = list(history)  # splices of hunks 1..k-1: maps this hunk's text back to the pin's lines
            history.append((pl.start, pl.end - pl.start, len(pl.core_post)))
            pin_idx = to_pin_line(prior, pl.start if pl.start < pl.end or pl.start == 0 else pl.start - 1)
            qual = sc.qualname(pin_idx + 1)
            name = edit_name(qual, used_names)
            numbered.append((pl.number, name))
            chosen = markers.pop(name, None) or markers.pop(str(pl.number), None)
            source_of_marker = "--marker" if chosen else ""
            notes: list[str] = []
            if chosen:
                bad = [m for m in chosen if m in pin_text or m not in post_text]
                if bad:
                    m = bad[0]
                    why = "is already in the pin's file, so the edit would read as merged on the pin" if m in pin_text \
                        else "is not in the file after the change, so it could never report a merge"
                    problems.append(Problem("bad_marker", f"--marker for {name} (hunk {pl.number}): {m!r} {why}",
                                            file=path, key="--marker"))
                    file_ok = False
                    continue
            else:
                auto = choose_marker(pl, pin_text, post_text, pin_words)
                chosen = [auto] if auto else []
                source_of_marker = "auto" if auto else ""
                if not auto:
                    what = "only deletes lines" if not any(pl.core_added) else \
                        "adds only lines (or pairs of lines) the pin's file already has"
                    notes.append(f"no merged marker: the hunk {what}; none was invented. It is recognised as "
                                 f"applied by its replacement text; pass --marker {name}=TEXT to add one")
            edit, b, a = widen(pl, name, chosen, pin_text, post_text, max_context, strict=True)
            if edit is None and chosen:
                edit, b, a = widen(pl, name, chosen, pin_text, post_text, max_context, strict=False)
                if edit is not None:
                    notes.append("replacement text is not unique once applied; the merged marker alone "
                                 "recognises the change")
            if edit is None:
                occ = b
                problems.append(Problem("anchor_not_unique",
                                        f"hunk {pl.number} ({pl.hunk.header}) cannot be made unique: "
                                        + (f"its anchor still occurs {occ} times " if occ > 1 else "no anchor ")
                                        + f"with up to {a} lines of context on each side",
                                        file=path, line=to_pin_line(prior, pl.start) + 1,
                                        hint="vendor it by hand (write an anchor that names something unique), or "
                                        "raise --max-context"))
                file_ok = False
                continue
            anchor_start = to_pin_line(prior, pl.start - b)
            rep = EditReport(file=path, hunk=pl.number, header=pl.hunk.header, name=name, line=anchor_start + 1,
                             qualname=qual, anchor_lines=len(split_lines(edit.anchor)), context_before=b,
                             context_after=a, widened_before=max(0, b - pl.lead), widened_after=max(0, a - pl.trail),
                             offset=pl.offset, fuzz=pl.fuzz, marker=chosen[0] if chosen else None,
                             marker_source=source_of_marker, notes=notes)
            reports.append(rep)
            edits.append(edit)
            where = f" in {qual}" if qual else ""
            comments[name] = f"{path} hunk {pl.number} ({pl.hunk.header}){where}" + (
                f"; widened {rep.widened_before}+{rep.widened_after} lines beyond the diff's context to be unique"
                if rep.widened else "")
        if file_ok and edits:
            file_entries.append(FileEdits(path=path, edits=edits))
            expected[path] = post_text
    for key in markers:
        problems.append(Problem("bad_marker", f"--marker names {key!r}, which is no edit of this patch "
                                f"(edits: {', '.join(n for _, n in numbered) or 'none'})", key="--marker"))
    for rep in reports:
        if rep.offset or rep.fuzz:
            warnings.append(f"{rep.file}: hunk {rep.hunk} placed {rep.offset:+d} lines from where the diff says"
                            + (f", with fuzz {rep.fuzz}" if rep.fuzz else ""))
        warnings.extend(f"{rep.file}: {rep.name}: {n}" for n in rep.notes)
    if problems:  # each code's registered exit status (schema codes), the worst of them
        return fail(max(registered_exit(p.code, EXIT_FINDINGS) for p in problems))
    if not file_entries:
        problems.append(Problem("nothing_to_vendor", "the diff has no change inside vllm/ to vendor", key="--diff"))
        return fail(registered_exit("nothing_to_vendor", EXIT_FINDINGS))

    if description is None:
        description = meta.get("body", "")
    try:
        patch = Patch(id=patch_id, title=title, upstream=upstream, vllm=vllm_spec, description=description,
                      after=list(after or []), files=file_entries)
    except ValidationError as exc:
        problems.extend(Problem("bad_patch", e.get("msg", "invalid"), key=".".join(map(str, e.get("loc", ()))) or None)
                        for e in exc.errors())
        return fail(EXIT_BAD_INPUT)
    problems.extend(verify(patch, pin, expected, version, check_compile=check_compile, warnings=warnings))
    if problems:
        return fail(EXIT_INTERNAL)
    from ..tomlwrite import dumps_patch

    head = header if header is not None else [
        f"Vendored by `sndr vendor` from {source}" + (f" against vLLM {version}" if version else "") + ".",
        "Say here why this patch exists, for whom, and when it can go.",
    ]
    text = dumps_patch(patch, header=head, comments=comments)
    return VendorResult(patch, text, reports, created, skipped, [], warnings, EXIT_OK)


def _safe_exists(pin: Reader, rel: str) -> bool:
    try:
        return pin(rel) is not None
    except SndrError:
        return False


def roundtrip_file(path: str, old: str | None, new: str, *, version: str = "",
                   max_context: int = DEFAULT_MAX_CONTEXT, check_compile: bool = False) -> tuple[str, str]:
    """Vendor the difflib diff of one file and check the result independently.

    Returns ``("ok", "")``, ``("refused", reason)`` or ``("wrong", reason)``:
    the written TOML must load back to the same patch, planning it on ``old``
    (``None``: the file is new) must give ``new`` byte-exactly, and every edit
    must read ``applied`` or ``merged`` when planned over ``new``.
    """
    status, reason, _ = roundtrip_result(path, old, new, version=version, max_context=max_context,
                                         check_compile=check_compile)
    return status, reason


def roundtrip_result(path: str, old: str | None, new: str, *, version: str = "",
                     max_context: int = DEFAULT_MAX_CONTEXT,
                     check_compile: bool = False) -> tuple[str, str, VendorResult]:
    """:func:`roundtrip_file`, also handing back the :class:`VendorResult` (for statistics)."""
    from ..load import parse_patch
    from ..plan import build_plan

    def read(rel: str) -> str | None:
        return old if rel == path else None

    diff = unified_diff(old, new, path)
    res = vendor_diff(diff, read, patch_id="RT0001", title=f"round trip {path}", version=version,
                      max_context=max_context, check_compile=check_compile, header=[])
    if not res.ok:
        return ("wrong" if res.exit_code == EXIT_INTERNAL else "refused",
                "; ".join(f"{p.code}: {p.message}" for p in res.problems), res)
    want, text = res.written()
    patch = parse_patch(text, "roundtrip.toml")
    if patch != want:
        return "wrong", "the written TOML loads back as a different patch", res
    ps = PatchSet(patches=[patch])
    plan = build_plan(ps, read, version, environ={}, check_compile=False)
    got = plan.changes.get(path)
    if got is None or got.new != new:
        return "wrong", "planning the patch on the old text does not give the new text", res
    on_new = build_plan(ps, lambda rel: new if rel == path else None, version, environ={}, check_compile=False)
    # A deletion that cannot show itself in the text (deletion_unverifiable) is proven by the
    # byte-exact check above instead.
    bad = [f"{e.name}={e.verdict.value}" for r in on_new.patches for e in r.edits
           if e.verdict not in (Verdict.APPLIED, Verdict.MERGED) and e.reason_code != "deletion_unverifiable"]
    if bad:
        return "wrong", "on the new text: " + ", ".join(bad), res
    return "ok", "", res


# ----------------------------------------------------------------------------- CLI


def _parse_markers(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or not text.strip():
            raise SndrError(Problem("bad_marker", f"--marker {item!r}: expected EDIT=TEXT", key="--marker"))
        out.setdefault(key, []).append(text)
    return out


def _target(out: str, patch_id: str, title: str) -> Path:
    p = Path(out)
    if p.suffix == ".toml":
        return p
    return p / f"{patch_id}-{slug(title)}.toml"


def _print_result(res: VendorResult, target: Path | None, quiet: bool) -> None:
    err = sys.stderr
    if not quiet:
        last = None
        for e in res.edits:
            if e.file != last:
                print(f"  {e.file}", file=err)
                last = e.file
            how = f"; widened {e.widened_before} before, {e.widened_after} after" if e.widened else ""
            marker = f"marker {e.marker!r}" if e.marker else "no marker"
            print(f"    hunk {e.hunk} {e.header} -> {e.name} (line {e.line}): anchor {e.anchor_lines} lines"
                  f"{how}; {marker}", file=err)
        for c in res.created:
            print(f"  {c}: created (whole file)", file=err)
        for s in res.skipped:
            print(f"  skipped {s}", file=err)
        for w in res.warnings:
            print(f"  warning: {w}", file=err)
    widened = [f"{e.file} hunk {e.hunk}" for e in res.edits if e.widened]
    if widened and not quiet:
        print(f"widened beyond the diff's context: {', '.join(widened)}", file=err)
    for p in res.problems:
        print(f"refused: {p.render()}", file=err)
    if res.ok and target is not None:
        nfiles = len(res.patch.files) if res.patch else 0
        print(f"wrote {target} ({len(res.edits)} edits, {len(res.created)} created, {nfiles} files)", file=err)
    elif not res.ok:
        print("nothing written", file=err)


def run_vendor(args) -> int:
    """``sndr vendor`` (its options: :mod:`sndr.commands.vendor`): write the patch file, print the report."""
    from ..cli import check_output, write_output
    from ..tree import open_tree

    if args.out is not None and str(args.out) == "-":  # '-' is stdout for every output: --stdout
        args.stdout, args.out = True, None
    if args.json:
        check_output(args.json, "--json")  # before any work: a refused output path changes nothing
    if args.stdout and args.json == "-":  # --json - means stdout holds the JSON document only
        raise SndrError(Problem("stdout_conflict", "--stdout and --json - would both write to stdout",
                                key="--json", hint="send the report to a file: --json FILE"))
    flag, named = "the patch file", False  # named: --out DIR, the directory the user named (never a symlink)
    if not args.stdout:
        from ..env import patches_dir, refuse_shipped_write

        given = args.out is not None
        if not given:  # the patch set in effect, as sync decide and pin advance write into; never the cwd
            args.out = str(patches_dir())
        refuse_shipped_write(args.out, flag="--out DIR")  # before any work: a reinstall would lose it
        if given:
            # before any work: a FILE.toml, or the DIR it goes into, never a symlink, FIFO, device or read-only
            # place (the file's own name is known after the vendoring; the writer checks it then)
            flag, named = "--out", Path(args.out).suffix != ".toml"
            check_output(args.out, flag, directory=named)

    if args.diff == "-":
        diff_text = sys.stdin.buffer.read().decode("utf-8")
        source = "stdin"
    else:
        from ..fsio import FileProblem, read_text_strict

        try:
            diff_text = read_text_strict(args.diff, what="the diff")
        except FileProblem as exc:
            code = "not_utf8" if exc.code == "not_utf8" else "diff_unreadable"
            raise SndrError(Problem(code, exc.message, file=exc.path, line=exc.line, key="--diff")) from None
        source = Path(args.diff).name
    tree = open_tree(args.tree)
    try:
        version = tree.version
    except SndrError:
        version = ""
    res = vendor_diff(diff_text, tree.read_text, patch_id=args.patch_id, title=args.title,
                      upstream=args.upstream, markers=_parse_markers(args.marker), version=version,
                      vllm_spec=args.vllm, max_context=args.max_context, fuzz=args.fuzz, strip=args.strip,
                      include=args.include, exclude=args.exclude, source=source,
                      diff_path=None if args.diff == "-" else str(args.diff))
    target = None
    if res.ok and not args.stdout:
        patch, text = res.written()
        target = _target(args.out, args.patch_id, patch.title)
        if target.exists() and not args.force:
            raise SndrError(Problem("patch_exists", "patch file already exists", file=str(target),
                                    hint="pass --force to overwrite it"))
        if target.parent.is_dir():
            same_id = [p for p in target.parent.glob(f"{args.patch_id}-*.toml") if p != target]
            same_id += [p for p in [target.parent / f"{args.patch_id}.toml"] if p.exists() and p != target]
            if same_id:
                raise SndrError(Problem("duplicate_id", f"another patch file already uses id {args.patch_id}",
                                        file=str(same_id[0]), key="--id"))
        write_output(target, text, flag, named_dir=named)
    if args.stdout and res.ok:
        sys.stdout.write(res.written()[1])
    _print_result(res, target, args.quiet)
    if args.json:
        write_output(args.json, json.dumps(res.to_json(), indent=2) + "\n", "--json")
    return res.exit_code
