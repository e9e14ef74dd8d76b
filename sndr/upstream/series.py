"""``python -m sndr import quilt|mbox SRC --to DIR --tree PIN``: a patch series becomes patch files.

A stack kept in another format needs a way in, not a rewrite by hand:

* ``quilt``: ``SRC`` is a directory with a ``series`` file (or ``SRC/patches/series``); its lines
  name the patches in order (``#`` comments, blank lines and a ``-pN`` option are honoured);
* ``mbox``: ``SRC`` is a directory of numbered ``git format-patch`` files (``0001-*.patch`` ...,
  taken in name order), or one mbox file holding several mails.

Each member goes through the vendor path (:func:`sndr.upstream.vendor.vendor_diff`) against the
pin *as the earlier members leave it* (an in-memory overlay the planner computes), and gets
``after = [<the previous imported member>]``: the patch files stack in series order, each
anchored on the text it really sees. A member that cannot be vendored is named with why and the
rest continue (a later member that needed its text then fails too, and is named). Nothing is
written for a failed member. ``DIR/_import.json`` is the report (a file whose name starts with
``_`` is not a patch). Exit 0 when every member was imported, 1 when some were not, 2 for bad
input (no series, an unreadable patch).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import EXIT_FINDINGS, EXIT_OK, Problem, SndrError
from ..fsio import FileProblem, read_text_strict
from ..model import ID_PATTERN

#: The report an import writes beside its patch files (a name starting with ``_`` is not a patch).
REPORT_NAME = "_import.json"
_MBOX_FROM = re.compile(r"^From [0-9a-f]{7,40} ", re.M)
_STRIP = re.compile(r"^-p(\d+)$")


@dataclass
class Member:
    """One patch of a series: where it came from, its position, its diff text and path strip."""

    position: int
    source: str
    text: str
    strip: int | None = None


@dataclass
class Imported:
    position: int
    source: str
    id: str
    ok: bool
    file: str | None = None
    title: str = ""
    after: list[str] = field(default_factory=list)
    edits: int = 0
    created: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)


def _read(path: Path, what: str) -> str:
    try:
        return read_text_strict(str(path), what=what)
    except FileProblem as exc:
        raise SndrError(Problem("import_unreadable", exc.message, file=exc.path, line=exc.line)) from None


def quilt_members(src: Path) -> list[Member]:
    """The members of a quilt series, in ``series`` order."""
    series = next((p for p in (src / "series", src / "patches" / "series") if p.is_file()), None)
    if series is None:
        raise SndrError(Problem("import_no_series", "no quilt series file (series, or patches/series)", file=str(src),
                                hint="point SRC at the directory that holds the series file"))
    out: list[Member] = []
    for n, raw in enumerate(_read(series, "the quilt series").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *opts = line.split()
        strip = None
        for o in opts:
            m = _STRIP.match(o)
            if m is None:
                raise SndrError(Problem("import_bad_series", f"unknown option {o!r} (only -pN is understood)",
                                        file=str(series), line=n))
            strip = int(m.group(1))
        path = series.parent / name
        if not path.is_file():
            raise SndrError(Problem("import_unreadable", f"the series names {name!r}, which is not a file",
                                    file=str(series), line=n))
        out.append(Member(len(out) + 1, name, _read(path, "a quilt patch"), strip))
    if not out:
        raise SndrError(Problem("import_no_series", "the quilt series is empty", file=str(series)))
    return out


def mbox_members(src: Path) -> list[Member]:
    """The members of a ``git format-patch`` series: numbered files of a directory, or the mails of one mbox."""
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.is_file() and p.suffix == ".patch")
        if not files:
            raise SndrError(Problem("import_no_series", "no *.patch files in the directory", file=str(src)))
        return [Member(i, p.name, _read(p, "a format-patch mail")) for i, p in enumerate(files, 1)]
    text = _read(src, "the mbox")
    starts = [m.start() for m in _MBOX_FROM.finditer(text)] or [0]
    if starts[0] != 0 and text[:starts[0]].strip():
        starts.insert(0, 0)
    mails = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
    return [Member(i, f"{src.name} mail {i}", m) for i, m in enumerate(mails, 1)]


def import_series(members: list[Member], read, version: str, out: Path, *, prefix: str, kind: str,
                  force: bool = False) -> tuple[list[Imported], int]:
    """Vendor each member against the pin as the earlier members leave it; write the patch files to ``out``."""
    from ..load import PatchSet
    from ..plan import build_plan
    from .vendor import vendor_diff
    from .vendor_anchor import slug

    overlay: dict[str, str | None] = {}

    def current(rel: str) -> str | None:
        return overlay[rel] if rel in overlay else read(rel)

    results: list[Imported] = []
    writes: list[tuple[Path, str]] = []
    prev: str | None = None
    width = max(3, len(str(len(members))))
    for m in members:
        pid = f"{prefix}{m.position:0{width}d}"
        after = [prev] if prev else []
        res = vendor_diff(m.text, current, patch_id=pid, version=version, strip=m.strip, source=m.source,
                          title=None if _has_subject(m.text) else _title_of(m.source), after=after,
                          header=[f"Imported by `sndr import {kind}` from {m.source} (member {m.position} of "
                                  f"{len(members)})" + (f" against vLLM {version}" if version else "") + ".",
                                  "Say here why this patch exists, for whom, and when it can go."])
        rec = Imported(position=m.position, source=m.source, id=pid, ok=res.ok, after=after, edits=len(res.edits),
                       created=list(res.created), skipped=[str(k) for k in res.skipped], warnings=list(res.warnings),
                       problems=[p.to_json() for p in res.problems])
        if res.ok:
            patch, text = res.written()
            rec.title = patch.title
            target = out / f"{pid}-{slug(patch.title)}.toml"
            rec.file = str(target)
            writes.append((target, text))
            plan = build_plan(PatchSet(patches=[patch]), current, version, environ={}, check_compile=False)
            for rel, ch in plan.changes.items():
                overlay[rel] = ch.new
            prev = pid
        results.append(rec)
    report = {"kind": kind, "version": version, "members": [asdict(r) for r in results]}
    _write_set(out, writes, report, force)
    return results, EXIT_OK if all(r.ok for r in results) else EXIT_FINDINGS


def _write_set(out: Path, writes: list[tuple[Path, str]], report: dict, force: bool) -> None:
    """The patch files and ``_import.json`` into ``out``, the directory the user named (``--to DIR``): through the
    one output writer, which never follows a symlink at ``out`` or at a file's name, and checks every path before
    it writes any (a refused one leaves nothing written). An existing patch file is replaced only with ``force``."""
    from ..cli import write_outputs

    existing = [t for t, _ in writes if t.exists()]
    if existing and not force:
        raise SndrError(Problem("patch_exists", "patch file already exists", file=str(existing[0]),
                                hint="pass --force to overwrite, or import into an empty directory"))
    files: list[tuple[str | Path, str]] = [*writes, (out / REPORT_NAME, json.dumps(report, indent=2) + "\n")]
    write_outputs(files, "--to", named_dir=True)


def _has_subject(text: str) -> bool:
    return re.search(r"^Subject:", text, re.M) is not None


def _title_of(source: str) -> str:
    """A title from a patch file name: ``0003-fix-the-clamp.patch`` -> ``fix the clamp``."""
    stem = re.sub(r"\.(patch|diff)$", "", Path(source).name)
    stem = re.sub(r"^\d+[-_]", "", stem)
    return re.sub(r"[-_]+", " ", stem).strip() or stem


def run_import(args) -> int:
    """``sndr import`` (its options: :mod:`sndr.commands.import_`)."""
    from ..tree import open_tree

    if args.kind == "genesis":
        return _genesis(args)
    if not args.tree:
        raise SndrError(Problem("usage", f"sndr import {args.kind} needs --tree (the pin the hunks are placed on)",
                                key="--tree"))
    prefix = args.prefix or {"quilt": "Q", "mbox": "M"}[args.kind]
    if not re.match(ID_PATTERN, prefix + "1"):
        raise SndrError(Problem("bad_id", f"--prefix {prefix!r} does not start a patch id", key="--prefix"))
    members = quilt_members(args.src) if args.kind == "quilt" else mbox_members(args.src)
    tree = open_tree(args.tree)
    try:
        version = tree.version
    except SndrError:
        version = ""
    results, code = import_series(members, tree.read_text, version, args.out, prefix=prefix, kind=args.kind,
                                  force=args.force)
    err = sys.stderr
    for r in results:
        if r.ok:
            if not args.quiet:
                print(f"  {r.position:>3} {r.source} -> {r.id} ({r.edits} edits"
                      + (f", {len(r.created)} created" if r.created else "") + ")", file=err)
        else:
            why = "; ".join(p.get("message", "") for p in r.problems) or "not vendored"
            print(f"  {r.position:>3} {r.source}: NOT imported: {why}", file=err)
        for s in r.skipped:
            if not args.quiet:
                print(f"        skipped {s}", file=err)
    done = sum(r.ok for r in results)
    print(f"imported {done} of {len(results)} into {args.out} (report: {args.out / REPORT_NAME})", file=err)
    if args.json:
        from ..cli import write_output

        write_output(args.json, json.dumps([asdict(r) for r in results], indent=2) + "\n", "--json")
    return code


def _genesis(args) -> int:
    """Convert a seed-system checkout statically; write the patch files and the report of what it could not
    express. Exit 0 when everything was expressed, 1 when something was left out (named in the report)."""
    from ..tomlwrite import dumps_patch
    from .genesis import REGISTRY, convert
    from .vendor_anchor import slug

    if not (args.src / REGISTRY).is_file():
        raise SndrError(Problem("import_no_series", f"not a seed-system checkout: no {REGISTRY}", file=str(args.src)))
    exists = None
    if args.tree:
        from ..tree import open_tree

        tree = open_tree(args.tree)

        def exists(rel: str) -> bool:
            try:
                return tree.read_text(rel) is not None
            except SndrError:
                return False
    try:
        res = convert(args.src, exists)
    except (ValueError, SyntaxError) as exc:
        raise SndrError(Problem("import_unreadable", str(exc), file=str(args.src / REGISTRY))) from None
    writes = []
    for p in res.patches:
        head = [f"Imported by `sndr import genesis` from {args.src.name} (apply order as after chains).",
                "Best-effort as the seed applies it: on_failure = skip."]
        writes.append((args.out / f"{p.id}-{slug(p.title)}.toml", dumps_patch(p, header=head)))
    report = dict(res.to_json(), kind="genesis", edits=sum(len(f.edits) for p in res.patches for f in p.files),
                  files=len({f.path for p in res.patches for f in p.files}))
    _write_set(args.out, writes, report, args.force)
    err = sys.stderr
    if not args.quiet:
        for n in res.notes:
            print(f"  {n.file}:{n.line or '?'}: {n.patch}: {n.what}", file=err)
        for pid, why in res.skipped.items():
            print(f"  {pid}: not imported: {why}", file=err)
    print(f"imported {len(res.patches)} patch(es), {report['edits']} edit(s) over {report['files']} file(s) into "
          f"{args.out}; {len(res.skipped)} registry entr(ies) not imported, {len(res.notes)} construct(s) not "
          f"expressed (report: {args.out / REPORT_NAME})", file=err)
    if args.json:
        from ..cli import write_output

        write_output(args.json, json.dumps(report, indent=2) + "\n", "--json")
    return EXIT_OK if not res.notes and not res.skipped else EXIT_FINDINGS
