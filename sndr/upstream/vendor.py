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
reader of the pin's files; the CLI around it is thin.
"""

from __future__ import annotations

import builtins
import difflib
import fnmatch
import json
import keyword
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ..classify import classify_edit
from ..errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, Problem, SndrError
from ..load import PatchSet
from ..locate import scopes
from ..model import ID_PATTERN, Edit, FileEdits, Patch, Verdict
from ..plan import Reader
from .defaults import DEFAULT_FUZZ, DEFAULT_MAX_CONTEXT  # their one home: stdlib only, read by the parser
from .diff import DiffFile, Hunk, parse_diff_files

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


# ----------------------------------------------------------------------------- text helpers


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` with their endings, split on ``\\n`` only.

    ``str.splitlines`` also splits on form feeds, ``\\x1c``, ``\\u2028`` and
    friends, which Python source may contain inside a line; a byte-exact tool
    must not.
    """
    if not text:
        return []
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def unified_diff(old: str | None, new: str | None, path: str, *, context: int = 3) -> str:
    """A ``git diff``-shaped unified diff of one file, correct for texts without a final newline.

    ``difflib.unified_diff`` alone writes a last line without its newline and
    glues the next diff line onto it; here such a line is followed by the
    ``\\ No newline at end of file`` marker, as diff and git write it.
    ``old=None`` makes a creation diff, ``new=None`` a deletion.
    """
    a = split_lines(old or "")
    b = split_lines(new or "")
    fromfile = "/dev/null" if old is None else f"a/{path}"
    tofile = "/dev/null" if new is None else f"b/{path}"
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out.append("new file mode 100644\n")
    elif new is None:
        out.append("deleted file mode 100644\n")
    for line in difflib.unified_diff(a, b, fromfile, tofile, n=context):
        if line.startswith(("---", "+++")) and not line.endswith("\n"):
            line += "\n"
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out) if len(out) > 1 + (old is None or new is None) else ""


# ----------------------------------------------------------------------------- the diff


@dataclass
class DiffHunk:
    """A hunk as vendoring reads it: pre- and post-image lines (built from :class:`sndr.upstream.diff.Hunk`)."""

    header: str
    src_start: int
    src_len: int
    pre: list[str]
    post: list[str]
    added: list[bool]  # per post line: a '+' line of the diff

    @classmethod
    def of(cls, h: Hunk) -> DiffHunk:
        return cls(h.header, h.old_start, h.old_count, h.pre_lines, h.post_lines, h.added_flags)


_SUBJECT = re.compile(r"^Subject:[ \t]*(?P<s>.*(?:\n[ \t]+.*)*)", re.M)
_PR = re.compile(r"\(#(\d+)\)\s*$")


def parse_diff(text: str) -> tuple[list[DiffFile[DiffHunk]], dict]:
    """The files of a unified diff, and what its mail header says (``subject``, ``body``, ``pr``).

    The diff itself is read by :func:`sndr.upstream.diff.parse_diff_files`, the
    parser ``sync`` uses too.
    """
    files = [DiffFile(f.source, f.target, f.status, [DiffHunk.of(h) for h in f.hunks])
             for f in parse_diff_files(text)]
    meta: dict = {}
    head = text.split("\ndiff --git ", 1)[0]
    m = _SUBJECT.search(head)
    if m:
        subject = re.sub(r"\s*\n[ \t]+", " ", m.group("s")).strip()
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        meta["subject"] = subject
        pr = _PR.search(subject)
        if pr:
            meta["pr"] = pr.group(1)
        body = head[m.end():].split("\n---\n", 1)[0].strip("\n")
        if body:
            meta["body"] = body
    if not files:
        raise SndrError(Problem("bad_diff", "the diff names no files", key="--diff",
                                hint="pass the output of git format-patch, git diff or diff -u"))
    return files, meta


def _components(raw: str, strip: int | None) -> list[str]:
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if strip is not None:
        return parts[strip:]
    return parts


def resolve_path(df: DiffFile[DiffHunk], exists: Callable[[str], bool], strip: int | None) -> str:
    """The tree-relative path a diff names: git's a/ b/ prefixes off, then the suffix from a ``vllm/`` component."""
    raw = df.raw_path
    if strip is None and df.source.startswith("a/") and df.target.startswith("b/"):
        raw = raw[2:]
    elif strip is None and df.status == "added" and df.target.startswith("b/"):
        raw = raw[2:]
    elif strip is None and df.status == "deleted" and df.source.startswith("a/"):
        raw = raw[2:]
    parts = _components(raw, strip)
    path = "/".join(parts)
    if strip is not None or exists(path):
        return path
    starts = [i for i, p in enumerate(parts) if p == "vllm"]
    for i in starts:
        cand = "/".join(parts[i:])
        if exists(cand):
            return cand
    if starts and df.status == "added":
        return "/".join(parts[starts[0]:])
    return path


# ----------------------------------------------------------------------------- results


@dataclass
class EditReport:
    file: str
    hunk: int  # 1-based within the file
    header: str
    name: str
    line: int  # first line of the anchor in the pin's file
    qualname: str
    anchor_lines: int
    context_before: int  # lines of context the anchor carries before the changed lines
    context_after: int
    widened_before: int  # of those, lines beyond the diff's own context
    widened_after: int
    offset: int = 0  # lines the hunk sat away from where the diff said
    fuzz: int = 0  # context lines of the diff dropped to place it
    marker: str | None = None
    marker_source: str = ""  # auto | --marker | ""
    notes: list[str] = field(default_factory=list)

    @property
    def widened(self) -> bool:
        return bool(self.widened_before or self.widened_after)


@dataclass
class VendorResult:
    patch: Patch | None
    text: str | None
    edits: list[EditReport]
    created: list[str]
    skipped: list[str]
    problems: list[Problem]
    warnings: list[str]
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def written(self) -> tuple[Patch, str]:
        """The patch and its TOML text; only a result that is :attr:`ok` has them."""
        if self.patch is None or self.text is None:
            raise ValueError(f"a vendor result that failed (exit {self.exit_code}) has no patch")
        return self.patch, self.text

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "id": self.patch.id if self.patch else None,
            "edits": [dict(asdict(e), widened=e.widened) for e in self.edits],
            "created": self.created,
            "skipped": self.skipped,
            "warnings": self.warnings,
            "problems": [p.to_json() for p in self.problems],
        }


# ----------------------------------------------------------------------------- placing hunks


@dataclass
class _Placed:
    number: int
    hunk: DiffHunk
    core_post: list[str]
    core_added: list[bool]
    start: int  # first changed line, index into the text hunks 1..k-1 left
    end: int  # one past the last changed line of the pre-image, same text
    lead: int  # diff context lines kept before the changed lines
    trail: int
    offset: int
    fuzz: int
    before: list[str]  # the text (as lines) this hunk is located in


def _split_core(pre: list[str], post: list[str]) -> tuple[int, int]:
    """Lines of common context before and after the changed lines of a hunk."""
    n = min(len(pre), len(post))
    lead = 0
    while lead < n and pre[lead] == post[lead]:
        lead += 1
    trail = 0
    while trail < n - lead and pre[-1 - trail] == post[-1 - trail]:
        trail += 1
    return lead, trail


def _find_block(lines: list[str], block: list[str], expected: int, floor: int) -> int | None:
    """Start of the occurrence of ``block`` in ``lines`` nearest to ``expected``, at or after ``floor``."""
    n, m = len(lines), len(block)
    if m == 0:
        return None
    if floor <= expected <= n - m and lines[expected:expected + m] == block:
        return expected
    first = block[0]
    best = None
    for i in range(floor, n - m + 1):
        if lines[i] == first and lines[i:i + m] == block:
            if best is None or abs(i - expected) < abs(best - expected):
                best = i
            elif i > expected:
                break
    return best


def _place(path: str, hunks: list[DiffHunk], pin_lines: list[str], fuzz: int,
           numbers: list[int], rounds: list[int]) -> tuple[list[_Placed], list[str], list[Problem]]:
    """Locate every hunk in order and build the post-image. Pure line arithmetic."""
    lines = list(pin_lines)
    placed: list[_Placed] = []
    problems: list[Problem] = []
    delta = 0
    floor = 0
    current_round = None
    for number, rnd, h in zip(numbers, rounds, hunks):
        if rnd != current_round:  # a later commit of a series: its line numbers are relative to the text so far
            current_round, delta, floor = rnd, 0, 0
        lead, trail = _split_core(h.pre, h.post)
        core_pre = h.pre[lead:len(h.pre) - trail]
        core_post = h.post[lead:len(h.post) - trail]
        core_added = h.added[lead:len(h.post) - trail]
        base = (h.src_start - 1 if h.src_len else h.src_start) + delta
        found = None
        for f in range(0, fuzz + 1):
            fl, ft = min(f, lead), min(f, trail)
            if f and not fl and not ft:
                break
            block = h.pre[fl:len(h.pre) - ft]
            if not block:
                if f == 0 and floor <= base <= len(lines):  # diff -U0 insertion: the header is all we have
                    found = (base, 0, 0, 0)
                break
            if f and not any(b.strip() for b in block):
                break
            idx = _find_block(lines, block, base + fl, floor)
            if idx is not None:
                found = (idx + lead - fl, idx - (base + fl), f, fl)
                break
        if found is None:
            hint = "the diff is not against this pin, or an earlier hunk changed these lines"
            if any(x.endswith("\r\n") for x in h.pre) and not any(x.endswith("\r\n") for x in lines[:50]):
                hint = "the diff has CRLF line endings and the file LF; convert the diff"
            problems.append(Problem("hunk_not_found", f"hunk {number} ({h.header}) does not apply: its pre-image "
                                    "is not in the pin's file", file=path, line=max(base, 0) + 1, hint=hint))
            continue
        start, offset, used_fuzz, dropped = found
        end = start + len(core_pre)
        placed.append(_Placed(number, h, core_post, core_added, start, end, lead - dropped,
                              trail - min(used_fuzz, trail), offset, used_fuzz, list(lines)))
        lines[start:end] = core_post
        delta += offset + len(core_post) - len(core_pre)
        floor = start + len(core_post)
    return placed, lines, problems


# ----------------------------------------------------------------------------- merged markers

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_OPENERS = ("(", "[", "{", ",", "\\")


def _marker_rank(marker: str, pair: bool, pin_words: set[str]) -> int | None:
    """0 best (an even number: a single line; odd: a pair); None: not usable.

    A marker is looked up anywhere in the whole file of a later pin, so it
    must not turn up there by coincidence: a line that brings in a name the
    pin's file does not know is best, then other code lines, then pairs of
    lines, and only then comments and short or bare lines (a lone
    ``logger.info(``), which upstream may well write for other reasons.
    """
    body = marker.strip()
    if not body or not re.search(r"[A-Za-z0-9]", body):
        return None  # blank or pure punctuation
    rows = [r.strip() for r in body.split("\n")]
    code_rows = [r for r in rows if r and not r.startswith("#") and not _prose(r)]
    words = _WORD.findall(" ".join(code_rows))
    novel = bool(code_rows) and any(w not in pin_words and _identifier_like(w) for w in words)
    bare = body.endswith(_OPENERS) and len(words) <= 2
    strong = bool(code_rows) and not bare and len(body) >= 8 and bool(words)
    rank = 0 if novel else 2 if strong else 4
    if pair and len(code_rows) < len([r for r in rows if r]):
        rank = max(rank, 2)  # half comment or prose: that half gets reworded
    if pair and any(not re.search(r"[A-Za-z0-9]", r) for r in rows):
        rank = 4  # half punctuation: the pair says little more than its other line
    return rank + (1 if pair else 0)


_KEYWORD_LINE = re.compile(r"^(import|from|return|raise|yield|assert|del|global|nonlocal|pass|break|continue|"
                           r"await|async|def|class|if|elif|else|for|while|with|try|except|finally|lambda)\b")


_BUILTIN_NAMES = frozenset(dir(builtins)) | frozenset(keyword.kwlist)


def _identifier_like(word: str) -> bool:
    """A name someone coined (``defer_async_loads``, ``RequestError``), not an English word or a builtin."""
    if word in _BUILTIN_NAMES:
        return False
    core = word.strip("_")
    return "_" in core or re.search(r"[a-z][A-Z]", core) is not None or len(core) >= 10


def _prose(row: str) -> bool:
    """A line of a docstring or other running text rather than code."""
    if any(c in row for c in "=()[]{}:") or _KEYWORD_LINE.match(row):
        return False
    return not any(_identifier_like(w) for w in _WORD.findall(row))


def choose_marker(pl: _Placed, pin_text: str, post_text: str, pin_words: set[str] | None = None) -> str | None:
    """The shortest characteristic added line (or pair) absent from the pin's file, present after the change."""
    if pin_words is None:
        pin_words = set(_WORD.findall(pin_text))
    before = pl.before[pl.start - 1] if pl.start > 0 else None
    after = pl.before[pl.end] if pl.end < len(pl.before) else None
    seq = ([(before, False)] if before is not None else []) + list(zip(pl.core_post, pl.core_added)) + \
          ([(after, False)] if after is not None else [])
    cands: list[tuple[int, int, str]] = []
    for line, is_added in seq:
        if is_added:
            m = line.strip()
            r = _marker_rank(m, False, pin_words)
            if r is not None:
                cands.append((r, len(m), m))
    for (x, xa), (y, ya) in zip(seq, seq[1:]):
        if (xa or ya) and x.strip() and y.strip() and x.endswith("\n"):
            m = x.lstrip() + y.rstrip()
            r = _marker_rank(m, True, pin_words)
            if r is not None:
                cands.append((r, len(m), m))
    # Tier first (a new name, code, anything), then a marker this hunk alone
    # brings (one that recurs in the file after the change would also call
    # the edit merged when upstream made only one of those changes), then
    # single before pair, then the shortest.
    best = None
    for r, n, m in cands:
        if m in pin_text:
            continue
        count = post_text.count(m)
        if not count:
            continue
        key = (r // 2, count > 1, r % 2, n, m)
        if best is None or key < best:
            best = key
    return best[-1] if best else None


# ----------------------------------------------------------------------------- widening


def _splits(max_before: int, max_after: int, limit: int):
    """(before, after) context sizes, fewest lines first, balanced first, context before first."""
    for total in range(0, 2 * limit + 1):
        opts = [(b, total - b) for b in range(0, total + 1)
                if b <= min(max_before, limit) and total - b <= min(max_after, limit)]
        opts.sort(key=lambda ba: (abs(ba[0] - ba[1]), ba[1]))
        yield from opts


def _widen(pl: _Placed, name: str, markers: list[str], pin_text: str, post_text: str, limit: int,
           strict: bool) -> tuple[Edit, int, int] | tuple[None, int, int]:
    """The smallest anchor around the hunk that the planner finds exactly there.

    Strict: the replacement must also read ``applied`` on the post-image
    (ignoring merged markers), so the edit recognises itself once applied.
    Returns (None, occurrences, context) when nothing within ``limit`` works.
    """
    lines = pl.before
    text = "".join(lines)
    offs = [0]
    for ln in lines:
        offs.append(offs[-1] + len(ln))
    post_core = "".join(pl.core_post)
    worst = 0
    # A deletion at a file boundary (or with no line on one side) can never read applied from the
    # text (classify's rule); the smallest unique anchor is kept for it, and the byte-exact
    # post-image check of the round trip is what proves it.
    unverifiable: tuple[Edit, int, int] | None = None
    for b, a in _splits(pl.start, len(lines) - pl.end, limit):
        s, e = pl.start - b, pl.end + a
        anchor = text[offs[s]:offs[e]]
        if not anchor.strip():
            continue
        repl = text[offs[s]:offs[pl.start]] + post_core + text[offs[pl.end]:offs[e]]
        if not repl or repl == anchor:
            continue
        at = offs[s]
        first = text.find(anchor)
        second = text.find(anchor, first + 1)
        if second != -1 and repl not in text:
            worst = max(worst, 2)
            continue  # a second occurrence that no replacement occurrence can cover
        try:
            edit = Edit(name=name, anchor=anchor, replacement=repl, merged_markers=markers)
        except ValidationError:
            continue
        fd = classify_edit(edit, text, pin_text)
        if fd.verdict != Verdict.APPLIES or fd.offset != at:
            if fd.verdict == Verdict.AMBIGUOUS:
                worst = max(worst, len(fd.offsets))
            continue
        bare = edit.model_copy(update={"merged_markers": []})
        post_fd = classify_edit(bare, post_text, post_text)
        if post_fd.verdict != Verdict.APPLIED and (strict or not markers):
            if post_fd.code == "deletion_unverifiable" and unverifiable is None:
                unverifiable = (edit, b, a)
            continue
        return edit, b, a
    if unverifiable is not None:
        return unverifiable
    return None, worst, limit


# ----------------------------------------------------------------------------- naming

_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]+")


def _edit_name(qualname: str, used: set[str]) -> str:
    parts = [p.strip("_") for p in qualname.split(".") if p.strip("_")][-2:]
    base = _NAME_BAD.sub("_", "-".join(parts)) if parts else "module"
    if not re.match(ID_PATTERN, base):
        base = "e" + base
    name, n = base, 2
    while name in used:
        name = f"{base}-{n}"
        n += 1
    used.add(name)
    return name


def _slug(title: str) -> str:
    """File-name part from a title: no ``[Tag]`` prefixes or ``(#123)`` PR numbers, cut at a word."""
    t = re.sub(r"\(#\d+\)|^\s*(\[[^\]]*\]\s*)+", " ", title)
    s = re.sub(r"[^a-z0-9]+", "-", t.lower()).strip("-")
    if len(s) > 48:
        s = s[:49].rsplit("-", 1)[0] if "-" in s[:49] else s[:48]
    return s.strip("-") or "patch"


# ----------------------------------------------------------------------------- the pure core


def _to_pin_line(history: list[tuple[int, int, int]], idx: int) -> int:
    """Map a line index of a partially patched text back to the pin's file (0-based)."""
    for pos, old, new in reversed(history):
        if idx >= pos + new:
            idx -= new - old
        elif idx >= pos:
            idx = pos
    return idx


def _match(path: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, g) for g in globs)


def vendor_diff(diff_text: str, read: Reader, *, patch_id: str, title: str | None = None,
                upstream: list[str] | None = None, markers: dict[str, list[str]] | None = None,
                version: str = "", vllm_spec: str = "", description: str | None = None,
                max_context: int = DEFAULT_MAX_CONTEXT, fuzz: int = DEFAULT_FUZZ, strip: int | None = None,
                include: Iterable[str] = (), exclude: Iterable[str] = (), check_compile: bool = True,
                source: str = "diff", header: list[str] | None = None,
                after: list[str] | None = None) -> VendorResult:
    """Turn ``diff_text`` into a patch for the tree ``read`` serves. Pure: reads through ``read`` only.

    ``markers`` maps an edit name, or a hunk number counted across the whole
    diff (``"3"``), to merged markers the author chose. Nothing is returned
    in ``text`` unless every hunk was vendored and the plan checks passed.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    skipped: list[str] = []
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
        problems.extend(exc.problems)
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
            skipped.append(f"{path}: not matched by --include")
            continue
        if exclude and _match(path, exclude):
            skipped.append(f"{path}: excluded by --exclude")
            continue
        if not path.startswith(_PACKAGE):
            skipped.append(f"{path}: outside vllm/ (not part of an installed vLLM; tests and docs are not shipped)")
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
            skipped.append(f"{path}: no content change (mode or metadata only)")
            continue
        numbers = list(range(hunk_no + 1, hunk_no + 1 + len(hunks)))
        hunk_no += len(hunks)
        if entries[0][1].status == "added":
            if pin_text is not None:
                problems.append(Problem("create_exists", "the diff creates this file, but the pin already has it",
                                        file=path, hint="the diff is not against this pin"))
                continue
            _, content_lines, probs = _place(path, [h for _, h in hunks], [], fuzz, numbers,
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
        placed, post_lines, probs = _place(path, [h for _, h in hunks], pin_lines, fuzz, numbers,
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
        pin_words = set(_WORD.findall(pin_text))
        history: list[tuple[int, int, int]] = []
        edits: list[Edit] = []
        file_ok = True
        for pl in placed:
            prior = list(history)  # splices of hunks 1..k-1: maps this hunk's text back to the pin's lines
            history.append((pl.start, pl.end - pl.start, len(pl.core_post)))
            pin_idx = _to_pin_line(prior, pl.start if pl.start < pl.end or pl.start == 0 else pl.start - 1)
            qual = sc.qualname(pin_idx + 1)
            name = _edit_name(qual, used_names)
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
            edit, b, a = _widen(pl, name, chosen, pin_text, post_text, max_context, strict=True)
            if edit is None and chosen:
                edit, b, a = _widen(pl, name, chosen, pin_text, post_text, max_context, strict=False)
                if edit is not None:
                    notes.append("replacement text is not unique once applied; the merged marker alone "
                                 "recognises the change")
            if edit is None:
                occ = b
                problems.append(Problem("anchor_not_unique",
                                        f"hunk {pl.number} ({pl.hunk.header}) cannot be made unique: "
                                        + (f"its anchor still occurs {occ} times " if occ > 1 else "no anchor ")
                                        + f"with up to {a} lines of context on each side",
                                        file=path, line=_to_pin_line(prior, pl.start) + 1,
                                        hint="vendor it by hand (write an anchor that names something unique), or "
                                        "raise --max-context"))
                file_ok = False
                continue
            anchor_start = _to_pin_line(prior, pl.start - b)
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
    if problems:
        code = EXIT_BAD_INPUT if any(p.code in ("bad_marker", "bad_diff") for p in problems) else EXIT_FINDINGS
        return fail(code)
    if not file_entries:
        problems.append(Problem("nothing_to_vendor", "the diff has no change inside vllm/ to vendor", key="--diff"))
        return fail(EXIT_FINDINGS)

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


def verify(patch: Patch, pin: Reader, expected: dict[str, str], version: str, *, check_compile: bool = True,
           warnings: list[str] | None = None) -> list[Problem]:
    """Plan ``patch`` on the pin and on the expected post-image; say where either disagrees."""
    from ..plan import build_plan

    problems: list[Problem] = []
    ps = PatchSet(patches=[patch])
    plan = build_plan(ps, pin, version, environ={}, check_compile=check_compile)
    for p in plan.problems:
        if p.code == "compile_error":
            if warnings is not None:
                warnings.append(f"{p.file}:{p.line}: the patched file does not compile under this Python "
                                f"({p.message}); the planner will refuse it here")
            continue
        problems.append(Problem("verify_failed", f"planning the patch on the pin fails: {p.render()}",
                                file=p.file, line=p.line))
    for rel, want in expected.items():
        got = plan.changes.get(rel)
        if got is None or got.new != want:
            problems.append(Problem("verify_mismatch", "planning the patch on the pin does not reproduce the diff's "
                                    "post-image byte-exactly", file=rel, hint="a bug in sndr vendor: please report"))
    after = build_plan(ps, lambda rel: expected.get(rel, pin(rel)), version, environ={}, check_compile=False)
    for res in after.patches:
        for e in res.edits:
            # A pure deletion cannot read applied from the text alone (classify's rule); the byte-exact
            # post-image check above is what proves it.
            unverifiable = e.verdict in (Verdict.DRIFTED, Verdict.OPTIONAL_ABSENT) \
                and e.reason_code == "deletion_unverifiable"
            if e.verdict not in (Verdict.APPLIED, Verdict.MERGED) and not unverifiable:
                problems.append(Problem("verify_not_applied", f"edit {e.name} reads {e.verdict.value} on the "
                                        f"post-image; it must read applied or merged ({e.reason})", file=e.file,
                                        line=e.line, hint="a bug in sndr vendor: please report"))
    return problems


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
    return p / f"{patch_id}-{_slug(title)}.toml"


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

    if args.json:
        check_output(args.json, "--json")  # before any work: a refused output path changes nothing

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
                      include=args.include, exclude=args.exclude, source=source)
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
        write_output(target, text, "the patch file")
    if args.stdout and res.ok:
        sys.stdout.write(res.written()[1])
    _print_result(res, target, args.quiet)
    if args.json:
        write_output(args.json, json.dumps(res.to_json(), indent=2) + "\n", "--json")
    return res.exit_code
