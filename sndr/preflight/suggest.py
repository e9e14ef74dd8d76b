"""Relocation suggestions: where did a drifted anchor most likely go, and how sure are we?

The preflight asks this for every edit that is ``drifted`` or ``file_missing``
on the candidate tree. The answer is a short ranked list of line windows
(file, line span, enclosing qualname, score 0-100, confidence class); it is
shown to a human who re-anchors the patch, and is never applied.

Where candidates come from (no Python loop over the windows of a file):

1. **the anchor's own file** on the candidate, when it still exists;
2. **heirs**: changed files that took a real share of the lines that left the
   pin file (a renamed or split module);
3. **seeded files**: changed (new or edited) files holding one of the
   anchor's distinctive lines exactly, or the ``def``/``class`` line of its
   enclosing scope on the pin. Code that moved has to land in text that
   changed, so identical files are never searched. The candidate tree's line
   index (:mod:`.lineindex`: stripped line -> files, on disk per tree digest;
   in memory for small inputs) answers the lookups, batched per preflight.

Inside each such file, only windows around *token hits* are scored: lines that
hold one of the anchor's rarest identifiers (``str.count`` picks the rarest,
``str.find`` locates their few occurrences: C-level scans of the file's
stripped text, which is joined once, so every window is a slice). Windows are
scored at the anchor's size with ``rapidfuzz.process.extract`` over stripped
lines; only the global shortlist is then refined (grown, shrunk, shifted)
with one more ``process.extract`` call per hit.

Ranking (explicit weights, points on top of the 0-100 text similarity; a bonus
only lifts a window whose similarity is at least :data:`BONUS_FLOOR`):

=====================  ======  ==================================================
evidence               points  why
=====================  ======  ==================================================
same qualname          +10     the enclosing ``Class.method`` is unchanged
same name only         +5      a method that moved class, a function that moved
same file              +8      edited code stays home (:data:`BONUS_SAME_FILE`)
heir file              +5      the file took lines that left the pin file
copy already there     -15     the other file held this text on the pin already:
                               a sibling copy (another model, another runner),
                               not where the code went
=====================  ======  ==================================================

Same qualname in the same file therefore outranks the same name elsewhere by
13 points plus the similarity gap, and a window in another file must be
clearly more similar (more than :data:`BONUS_SAME_FILE` points, or an heir) to
beat the edited spot at home.

Confidence (:func:`confidence`) is a class from calibrated thresholds on the
similarity, the score and the share of the anchor's distinctive lines the
window holds verbatim; ``docs/preflight-calibration.md`` publishes the
per-class precision on labelled cases from real vLLM trees, and how often
code that really vanished gets ``high``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import TYPE_CHECKING

from rapidfuzz import fuzz, process

from ..locate import Scopes, scopes
from .lineindex import MemoryIndex

if TYPE_CHECKING:  # the Literal's home; not imported at run time (models pulls in pydantic)
    from .models import Confidence

__all__ = ["Suggestion", "Relocator", "anchor_lines", "key_lines", "confidence", "held_share", "CONFIDENCE_CLASSES"]

#: Lines too common to say where code went.
_BORING = frozenset({
    "", "else:", "try:", "finally:", "pass", "return", "return None", "return True", "return False", "break",
    "continue", ")", "]", "}", "),", "],", "},", "):", "] = []", '"""', "'''", "# noqa", "raise", "else",
    "except Exception:", "yield", "return result", "return out", "return output", "@property", "@staticmethod",
    "@classmethod", "@abstractmethod", "@torch.inference_mode()", "@override", "else: # noqa",
})
_MIN_KEY_LEN = 8
_DEF_RE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_PART = re.compile(r"[A-Za-z][a-z0-9]{3,}|[A-Z0-9]{4,}")  # parts of snake_case and CamelCase names


def _tokens(line: str) -> frozenset:
    """Identifiers and their parts: a renamed ``_parse_part`` still shares ``parse`` and ``part``."""
    return frozenset((*_TOKEN.findall(line), *_PART.findall(line)))
#: Identifiers too common to locate anything.
_COMMON_TOKENS = frozenset({"self", "None", "True", "False", "return", "import", "from", "torch", "Tensor", "list",
                            "dict", "tuple", "else", "elif", "with", "assert", "raise", "lambda", "await", "async",
                            "yield", "pass", "break", "continue", "class", "global", "int", "str", "bool",
                            "float", "Optional", "Any", "isinstance", "len", "range", "super", "__init__"})

# -- ranking weights (points on top of the 0-100 similarity) -------------------------------------------
BONUS_SAME_QUALNAME = 10
BONUS_SAME_NAME = 5  # last component equal: a method that moved to another class, a function to another module
BONUS_SAME_FILE = 8  # edited code stays home unless the evidence elsewhere is clearly stronger
BONUS_HEIR_FILE = 5  # the file inherited lines that left the anchor's pin file
PENALTY_COPY = 15  # the other file already held this text on the pin: a sibling copy, not a destination
#: Bonuses only lift windows that already look like the anchor.
BONUS_FLOOR = 40
#: Suggestions below this score are not shown.
MIN_SCORE = 45
#: A window with no signal but its text (another file, another scope) must be this similar.
MIN_COLD_SIMILARITY = 75
#: Runners-up this many points behind the best suggestion are not shown.
RUNNER_UP_GAP = 35
#: A same-file window this similar ends the search (edited in place).
SAME_FILE_CONFIDENT = 92
#: Departed lines sampled per pin file to find its heirs.
HEIR_SAMPLE = 96
#: Share of the pin anchor's key lines the other file held on the pin for it to count as a copy.
COPY_SHARE = 0.6
#: Token hits considered per file (the rarest identifiers first).
MAX_TOKEN_HITS = 64
#: Windows refined per suggestion (the global shortlist).
SHORTLIST = 8

# -- confidence classes (calibrated: benchmarks/calibrate_preflight.py, docs/preflight-calibration.md) ---
CONFIDENCE_CLASSES: tuple[Confidence, ...] = ("high", "medium", "low")
#: ``high``: at least this similar, this score, and holding at least this share of the anchor's
#: distinctive lines verbatim (fitted on seed 11, validated on held-out stacks).
HIGH_SIMILARITY = 84
HIGH_SCORE = 98
HIGH_HELD = 0.5
#: ``medium``: at least this similar, this score and this share; below is ``low`` (a hint, never a
#: re-anchor target).
MEDIUM_SIMILARITY = 64
MEDIUM_SCORE = 82
MEDIUM_HELD = 0.34


def confidence(similarity: float, score: float, held: float = 1.0) -> Confidence:
    """``high``, ``medium`` or ``low`` for a suggestion (thresholds above, calibrated on real trees).

    ``held`` is the share of the anchor's distinctive lines (:func:`key_lines`)
    that the window holds verbatim: similar text that kept none of them is
    code that was rewritten, and never ``high``.
    """
    if similarity >= HIGH_SIMILARITY and score >= HIGH_SCORE and held >= HIGH_HELD:
        return "high"
    if similarity >= MEDIUM_SIMILARITY and score >= MEDIUM_SCORE and held >= MEDIUM_HELD:
        return "medium"
    return "low"


def held_share(keys: list[str], window_lines: Iterable[str]) -> float:
    """Share of ``keys`` (stripped distinctive anchor lines) among the stripped ``window_lines``."""
    if not keys:
        return 1.0
    got = {ln.strip() for ln in window_lines}
    return sum(1 for k in keys if k in got) / len(keys)


@dataclass(frozen=True)
class Suggestion:
    file: str
    line: int  # first line of the window, 1-based, on the candidate
    end_line: int
    qualname: str
    score: int  # 0-100: similarity plus the bonuses, capped
    similarity: int  # 0-100: rapidfuzz ratio of stripped lines
    reasons: tuple[str, ...] = ()
    text: str = ""
    confidence: Confidence = "low"


def anchor_lines(anchor: str) -> list[str]:
    lines = anchor.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def key_lines(lines: Iterable[str]) -> list[str]:
    """Stripped anchor lines distinctive enough to look up exactly."""
    out = []
    for ln in lines:
        s = ln.strip()
        if len(s) >= _MIN_KEY_LEN and s not in _BORING and not s.startswith("#") and s not in out:
            out.append(s)
    if not out:  # a short anchor: every non-blank line is all we have
        out = [s for s in (ln.strip() for ln in lines) if s and s not in _BORING]
    return out


class _File:
    """One candidate file: its stripped lines joined once, so windows are slices and searches are C-level scans."""

    __slots__ = ("text", "lines", "norm", "joined", "offs", "scopes")

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.norm = list(map(str.strip, self.lines))  # moved code often changes indentation
        self.joined = "\n".join(self.norm)
        # offs[i]: where stripped line i starts in ``joined`` (the lengths before it, plus one newline each).
        self.offs = [o + i for i, o in enumerate(accumulate(map(len, self.norm), initial=0))]
        self.scopes: Scopes | None = None  # parsed on first use (a qualname asked for)

    def windows(self, starts: list[int], size: int) -> list[str]:
        """Stripped lines ``s .. s+size`` joined for each start ``s``: slices of the joined text, one
        comprehension, no per-line join."""
        j, offs, n = self.joined, self.offs, len(self.norm)
        return [j[offs[s]:offs[s + size if s + size < n else n] - 1] for s in starts]

    def _line(self, pos: int) -> int:
        return bisect_right(self.offs, pos) - 1

    def where(self, lines: Iterable[str], cap: int = 40) -> list[tuple[int, str]]:
        """(index, line) of the file's stripped lines equal to one of ``lines`` (``str.find`` scans, in C)."""
        j, out = self.joined, []
        for s in lines:
            if len(s) < 4:
                continue
            pos, got = j.find(s), 0
            while pos >= 0 and got < cap:
                end = pos + len(s)
                if (pos == 0 or j[pos - 1] == "\n") and (end == len(j) or j[end] == "\n"):
                    out.append((self._line(pos), s))
                    got += 1
                pos = j.find(s, end)
        return out

    def token_lines(self, tokens: Iterable[str], cap: int) -> tuple[list[int], frozenset]:
        """Lines holding the anchor's rarest tokens (substring counts in C pick them), and those tokens."""
        counted = sorted((n, tok) for tok in tokens if (n := self.joined.count(tok)))
        rare: list[str] = []
        total = 0
        for n, tok in counted:
            if rare and total + n > cap:
                break
            rare.append(tok)
            total += n
        if not rare:
            return [], frozenset()
        # At most ``cap`` occurrences in all (the rare tokens were picked so): one C-level find each.
        j, offs, found = self.joined, self.offs, set()
        for tok in rare:
            pos = j.find(tok)
            while pos >= 0:
                found.add(bisect_right(offs, pos) - 1)
                pos = j.find(tok, pos + 1)
        hits = sorted(found)
        return hits[: cap * 2], frozenset(rare)


@dataclass
class _Hit:
    file: str
    start: int  # 0-based line index
    size: int
    similarity: float
    reasons: list[str] = field(default_factory=list)


@dataclass
class _Anchor:
    lines: list[str]
    norm: str
    n: int
    keys: list[str]
    index: dict[str, list[int]]
    tokens: frozenset


def _anchor(anchor: str) -> _Anchor:
    lines = anchor_lines(anchor)
    index: dict[str, list[int]] = {}
    for j, ln in enumerate(lines):
        index.setdefault(ln.strip(), []).append(j)
    toks = frozenset(t for t in _tokens(anchor) if t not in _COMMON_TOKENS and t.lower() not in _COMMON_TOKENS)
    return _Anchor(lines, "\n".join(s.strip() for s in lines), len(lines), key_lines(lines), index, toks)


class Relocator:
    """Suggestion search over a candidate tree, given what changed since the pin.

    ``pin_text`` and ``cand_text`` read a file (``None`` when missing);
    ``changed`` lists the candidate files that are new or differ from the pin.
    Everything expensive (line sets, heirs, token sets, parsed scopes) is built
    lazily and shared between the edits of one preflight. ``files`` may be a
    dict shared with other relocators over the same candidate tree (``--via``
    hops), so a tree's per-file views are built once.
    """

    def __init__(self, pin_text: Callable[[str], str | None], cand_text: Callable[[str], str | None],
                 changed: Iterable[str], scopes_of: Callable[[str], Scopes] = scopes,
                 files: dict | None = None, index=None):
        self._scopes = scopes_of
        self._pin_text = pin_text
        self._cand_text = cand_text
        self.changed = sorted(set(changed))
        self._changed_set = frozenset(self.changed)
        self._files: dict[str, _File | None] = {} if files is None else files
        # stripped line -> files holding it: the candidate tree's on-disk index (lineindex.TreeIndex), or
        # one built in memory over the changed files.
        self._index = index if index is not None else MemoryIndex(self.changed, cand_text)
        self._heirs: dict[str, dict[str, float]] = {}
        self._departures: dict[str, frozenset] = {}
        self._located: dict[str, list[str]] = {}  # stripped line -> changed files holding it
        self._pin_sets: dict[str, frozenset] = {}

    # -- lazy state -----------------------------------------------------------

    def _file(self, rel: str) -> _File | None:
        if rel not in self._files:
            text = self._cand_text(rel)
            self._files[rel] = _File(text) if text is not None else None
        return self._files[rel]

    def _files_with(self, lines: Iterable[str]) -> dict[str, list[str]]:
        """stripped line -> changed files holding it; one index lookup for every new batch."""
        want = [s for s in dict.fromkeys(lines) if s not in self._located]
        if want:
            got = self._index.lookup(want)
            changed = self._changed_set
            for s in want:
                self._located[s] = [rel for rel in got.get(s, ()) if rel in changed]
        return self._located

    def _departed(self, rel: str) -> frozenset:
        """A sample of the most distinctive (longest) lines that left ``rel`` between the trees."""
        got = self._departures.get(rel)
        if got is not None:
            return got
        pin = self._pin_text(rel)
        if pin is None:
            self._departures[rel] = frozenset()
            return self._departures[rel]
        departed = {s for s in map(str.strip, pin.split("\n")) if len(s) >= 12 and s not in _BORING}
        f = self._file(rel)
        if f is not None:
            departed.difference_update(f.norm)
        # The longest first, ties by text (a stable sort of the sorted lines: both sorts in C).
        self._departures[rel] = frozenset(sorted(sorted(departed), key=len, reverse=True)[:HEIR_SAMPLE])
        return self._departures[rel]

    def prefetch(self, requests: Iterable[tuple[str, str]]) -> None:
        """Index, in one batch, the lines that ``suggest`` will look up for these (anchor, file) pairs."""
        want: set[str] = set()
        for anchor, file in requests:
            want.update(key_lines(anchor_lines(anchor)))
            if file not in self._heirs:
                want.update(self._departed(file))
        self._files_with(want)

    def heirs(self, rel: str) -> dict[str, float]:
        """Changed candidate files that took lines which left ``rel`` (share of the departed lines)."""
        if rel in self._heirs:
            return self._heirs[rel]
        sample = self._departed(rel)
        out: Counter = Counter()
        if sample:
            where = self._files_with(sample)
            for s in sample:
                out.update(f for f in where[s] if f != rel)
        # Keep the files that took a real share, not the ones sharing a boilerplate line.
        ranked = sorted(((f, n / len(sample)) for f, n in out.items()), key=lambda kv: (-kv[1], kv[0]))[:8]
        self._heirs[rel] = {k: v for k, v in ranked if v >= 0.02}
        return self._heirs[rel]

    # -- the search -----------------------------------------------------------

    def suggest(self, anchor: str, file: str, qualname: str | None = None, pin_line: int | None = None,
                limit: int = 3) -> list[Suggestion]:
        """Up to ``limit`` ranked places on the candidate where ``anchor`` (from ``file``) most likely went.

        ``qualname`` and ``pin_line`` say where the anchor sat on the pin
        (enclosing ``Class.method``, first line); both are optional.
        """
        a = _anchor(anchor)
        pin_def = self._pin_def(file, qualname)
        hits: list[_Hit] = []
        same = self._file(file)
        if same is not None:
            hits += self._scan_file(file, same, a, self._starts(same, a, pin_def, pin_line, whole=True))
            for h in hits:
                h.reasons.append("same file")
        best_same = max((h.similarity for h in hits), default=0.0)
        heirs: dict[str, float] = {}
        if best_same < SAME_FILE_CONFIDENT:
            heirs = self.heirs(file)
            wanted = list(a.keys)
            if pin_def is not None and pin_def[0] not in wanted:
                wanted.append(pin_def[0])
            seeded = self._global_seeds(wanted, a.keys, file, heirs)
            whole = [rel for rel, share in sorted(heirs.items(), key=lambda kv: -kv[1])[:3] if share >= 0.05]
            for rel in dict.fromkeys([*whole, *seeded]):
                f = self._file(rel)
                if f is None:
                    continue
                found = self._scan_file(rel, f, a, self._starts(f, a, pin_def, pin_line, whole=rel in whole))
                for h in found:
                    if rel in heirs:
                        h.reasons.append(f"content moved here from {file}")
                hits += found
        return self._rank(hits, a, file, qualname, heirs, limit)

    def _starts(self, f: _File, a: _Anchor, pin_def, pin_line: int | None, whole: bool) -> set[int]:
        """Window starts worth scoring in ``f``: around exact line hits, token hits and the enclosing def."""
        starts: set[int] = set()
        matched = set()
        for i, s in f.where(a.keys):
            starts.update(i - j for j in a.index.get(s, ()))
            matched.add(s)
        if len(matched) < 2 and (whole or not matched):  # edited beyond exact lines: the rarest tokens
            hit_lines, rare = f.token_lines(a.tokens, MAX_TOKEN_HITS)
            if hit_lines:
                a_rows = [j for j, ln in enumerate(a.lines) if any(tok in ln for tok in rare)] or [0]
                starts.update(i - j for i in hit_lines for j in a_rows[:8])
        if pin_def is not None:
            def_line_text, def_line, end_line = pin_def
            delta = (pin_line - def_line) if pin_line else 0
            for i, _ in f.where([def_line_text]):
                # The enclosing def is here: look through its body, around where the anchor sat.
                lo = i + max(0, delta - 20)
                hi = i + max(delta + 20, min(end_line - def_line, 120))
                starts.update(range(lo, hi + 1))
        return starts

    def _pin_def(self, file: str, qualname: str | None) -> tuple[str, int, int] | None:
        """(stripped def line, its line, span end) of the anchor's enclosing scope on the pin."""
        if not qualname:
            return None
        pin = self._pin_text(file)
        if pin is None:
            return None
        span = self._scopes(pin).span_of(qualname)
        if span is None:
            return None
        lines = pin.split("\n")
        for i in range(span[0] - 1, min(span[1], len(lines))):
            if _DEF_RE.match(lines[i]):
                return lines[i].strip(), i + 1, span[1]
        return None

    def _global_seeds(self, wanted: list[str], keys: list[str], file: str, heirs: dict[str, float]) -> list[str]:
        """The best-matching changed files holding the anchor's key lines (or its def line)."""
        if not wanted:
            return []
        where = self._files_with(wanted)
        key_set = set(keys)
        weight: dict[str, float] = {}
        for k in wanted:
            for rel in where[k]:
                if rel != file:
                    weight[rel] = weight.get(rel, 0.0) + (1.0 if k in key_set else 0.5)
        for rel in weight:
            if rel in heirs:
                weight[rel] += 0.5
        return [rel for rel, _ in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]

    @staticmethod
    def _scan_file(rel: str, f: _File, a: _Anchor, starts: set[int]) -> list[_Hit]:
        """The best windows of ``f`` at the anchor's size around ``starts`` (one C-level extract)."""
        total = len(f.lines)
        if total == 0:
            return []
        size = max(1, min(a.n, total))
        last = max(0, total - size)
        near = set(starts)
        near.update([x - 1 for x in starts])
        near.update([x + 1 for x in starts])
        cand = sorted(s for s in near if 0 <= s <= last)
        if not cand:
            return []
        top = process.extract(a.norm, f.windows(cand, size), scorer=fuzz.ratio, limit=6,
                              score_cutoff=BONUS_FLOOR - 10)
        out: list[_Hit] = []
        for _, sim, idx in top:
            s = cand[idx]
            if any(h.start - size < s < h.start + size for h in out):
                continue
            out.append(_Hit(rel, s, size, sim))
        return out

    def _refine(self, h: _Hit, a: _Anchor) -> _Hit:
        """Grow, shrink and shift a window (upstream edits add and drop lines): one C-level extract."""
        f = self._files[h.file]
        assert f is not None
        total, n = len(f.lines), a.n
        sizes = range(max(1, n - max(2, n // 3)), n + max(2, n // 2) + 1)
        # Tightest windows first: on a tie the first (smallest) wins, which is what a human would re-anchor on.
        shapes = [(s, k) for k in sizes for s in range(h.start - 3, h.start + 4) if 0 <= s and s + k <= total]
        if not shapes:
            return h
        j, offs, last = f.joined, f.offs, len(f.norm)
        best = process.extractOne(a.norm, [j[offs[s]:offs[min(s + k, last)] - 1] for s, k in shapes], scorer=fuzz.ratio)
        if best is None or best[1] <= h.similarity:
            return h
        s, k = shapes[best[2]]
        return _Hit(h.file, s, k, best[1], h.reasons)

    def _is_copy(self, rel: str, a: _Anchor) -> bool:
        """``rel`` held the anchor's key lines on the pin already: a sibling copy, not where the code went."""
        if not a.keys:
            return False
        got = self._pin_sets.get(rel)
        if got is None:
            text = self._pin_text(rel)
            got = self._pin_sets[rel] = frozenset(map(str.strip, text.split("\n"))) if text is not None else frozenset()
        return sum(1 for k in a.keys if k in got) >= COPY_SHARE * len(a.keys)

    def _rank(self, hits: list[_Hit], a: _Anchor, file: str, qualname: str | None, heirs: dict[str, float],
              limit: int) -> list[Suggestion]:
        hits.sort(key=lambda h: (-h.similarity, h.file != file, h.file, h.start))
        # Refining and qualnames (a parse of the file) only for the front runners.
        shortlist = [self._refine(h, a) for h in hits[:SHORTLIST]]
        scored: list[tuple[float, float, Suggestion]] = []
        want_last = qualname.rsplit(".", 1)[-1] if qualname else None
        best_sim = max((h.similarity for h in shortlist), default=0.0)
        for h in shortlist:
            f = self._files[h.file]
            assert f is not None
            # A parse per file: only where the qualname can change the order (or is shown, below).
            needed = qualname and (h.file == file or h.file in heirs or h.similarity >= best_sim - 12)
            q = self._qualname(f, h.start, h.size) if needed else None
            bonus = 0
            reasons = list(dict.fromkeys(h.reasons))
            if qualname and q == qualname:
                bonus += BONUS_SAME_QUALNAME
                reasons.insert(0, "same qualname")
            elif want_last and q and q.rsplit(".", 1)[-1] == want_last:
                bonus += BONUS_SAME_NAME
                reasons.insert(0, f"same name ({want_last})")
            if h.file == file:
                bonus += BONUS_SAME_FILE
            elif h.file in heirs:
                bonus += BONUS_HEIR_FILE
            elif self._is_copy(h.file, a):
                bonus -= PENALTY_COPY
                reasons.append("a copy that was already there on the pin")
            sim = h.similarity
            raw = sim + bonus if sim >= BONUS_FLOOR else sim  # ranked uncapped: a signal breaks a 100 tie
            score = max(0.0, min(100.0, raw))
            if score < MIN_SCORE or (bonus <= 0 and sim < MIN_COLD_SIMILARITY):
                continue
            if not reasons:
                reasons.append("similar text")
            text = "\n".join(f.lines[h.start:h.start + h.size]) + "\n"
            held = held_share(a.keys, f.norm[h.start:h.start + h.size])
            scored.append((raw, sim, Suggestion(file=h.file, line=h.start + 1, end_line=h.start + h.size,
                                                  qualname=q if q is not None else "\0", score=int(round(score)), similarity=int(round(sim)),
                                                  reasons=tuple(reasons), text=text,
                                                  confidence=confidence(round(sim), round(score), held))))
        scored.sort(key=lambda t: (-t[0], -t[1], t[2].file, t[2].line))
        out: list[Suggestion] = []
        for _, _, sug in scored:
            if any(o.file == sug.file and o.line <= sug.end_line and sug.line <= o.end_line for o in out):
                continue
            if out and sug.score < out[0].score - RUNNER_UP_GAP:
                break  # far behind the best: noise to a reader
            if sug.qualname == "\0":
                f = self._files[sug.file]
                assert f is not None
                sug = replace(sug, qualname=self._qualname(f, sug.line - 1, sug.end_line - sug.line + 1))
            out.append(sug)
            if len(out) == limit:
                break
        return out

    def _qualname(self, f: _File, start: int, size: int) -> str:
        sc = f.scopes
        if sc is None:
            sc = f.scopes = self._scopes(f.text)
        # The first non-blank line decides: a window may start on a blank line before a def.
        for i in range(start, min(start + size, len(f.lines))):
            if f.norm[i]:
                return sc.qualname(i + 1)
        return sc.qualname(start + 1)
