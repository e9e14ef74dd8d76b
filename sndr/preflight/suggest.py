"""Relocation suggestions: where did a drifted anchor most likely go?

The preflight asks this for every edit that is ``drifted`` or ``file_missing``
on the candidate tree. The answer is a short ranked list of line windows
(file, line span, enclosing qualname, score 0-100); it is shown to a human
who re-anchors the patch, and is never applied.

How candidates are found, cheapest first:

1. the anchor's own file on the candidate, when it still exists: every
   window of it is scored (one rapidfuzz pass in C);
2. the files that are new or changed between the two trees, and only those:
   code that moved out of a file has to land in text that changed. They are
   prefiltered by exact (indentation-insensitive) line hits: each such file
   keeps a set of its stripped lines, built once, so a lookup is a set
   membership test rather than a scan. Windows are scored only around hits;
3. the enclosing ``def``/``class`` line of the anchor on the pin is one more
   key line, so a function that moved to another module is found by its
   signature even when its body changed.

Scores weigh the text similarity of the window (``rapidfuzz.fuzz.ratio`` over
stripped lines) with three signals: the window has the anchor's qualname on
the candidate (from ``ast`` spans), it lies in the same file, or it lies in a
file that inherited the pin file's departed lines (a renamed or split file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from rapidfuzz import fuzz, process

from ..locate import Scopes, scopes

__all__ = ["Suggestion", "Relocator", "anchor_lines", "key_lines"]

#: Lines too common to say where code went.
_BORING = frozenset({
    "", "else:", "try:", "finally:", "pass", "return", "return None", "return True", "return False", "break",
    "continue", ")", "]", "}", "),", "],", "},", "):", "] = []", '"""', "'''", "# noqa", "raise", "else",
    "except Exception:", "yield", "return result", "return out", "return output", "@property", "@staticmethod",
    "@classmethod", "@abstractmethod", "@torch.inference_mode()", "@override", "else: # noqa",
})
_MIN_KEY_LEN = 8
_DEF_RE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")

#: Score bonuses, in points on top of the 0-100 text similarity.
BONUS_SAME_QUALNAME = 10
BONUS_SAME_NAME = 5  # last component equal: a method that moved to another class, a function to another module
BONUS_SAME_FILE = 4
BONUS_HEIR_FILE = 3  # the file inherited lines that left the anchor's pin file
#: Bonuses only lift windows that already look like the anchor.
BONUS_FLOOR = 40
#: Suggestions below this score are not shown.
MIN_SCORE = 45
#: Departed lines sampled per pin file to find its heirs.
HEIR_SAMPLE = 96
#: A window with no signal but its text (another file, another scope) must be this similar.
MIN_COLD_SIMILARITY = 75
#: Runners-up this many points behind the best suggestion are not shown.
RUNNER_UP_GAP = 35
#: A same-file window this similar ends the search (edited in place).
SAME_FILE_CONFIDENT = 92


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


@dataclass
class _File:
    text: str
    lines: list[str]
    norm: list[str]  # stripped lines: moved code often changes indentation

    @classmethod
    def of(cls, text: str) -> "_File":
        lines = text.split("\n")
        return cls(text, lines, list(map(str.strip, lines)))

    def where(self, keys: set[str]) -> list[tuple[int, str]]:
        return [(i, s) for i, s in enumerate(self.norm) if s in keys]

    def window(self, start: int, size: int) -> str:
        return "\n".join(self.norm[start:start + size])


@dataclass
class _Hit:
    file: str
    start: int  # 0-based line index
    size: int
    similarity: float
    reasons: list[str] = field(default_factory=list)


class Relocator:
    """Suggestion search over a candidate tree, given what changed since the pin.

    ``pin_text`` and ``cand_text`` read a file (``None`` when missing);
    ``changed`` lists the candidate files that are new or differ from the pin.
    Everything expensive (line sets, heirs, parsed scopes) is built lazily and
    shared between the edits of one preflight.
    """

    def __init__(self, pin_text: Callable[[str], "str | None"], cand_text: Callable[[str], "str | None"],
                 changed: Iterable[str], scopes_of: Callable[[str], Scopes] = scopes):
        self._scopes = scopes_of
        self._pin_text = pin_text
        self._cand_text = cand_text
        self.changed = sorted(set(changed))
        self._files: dict[str, _File | None] = {}
        self._sets: list[tuple[str, frozenset]] | None = None
        self._heirs: dict[str, dict[str, float]] = {}

    # -- lazy state -----------------------------------------------------------

    def _file(self, rel: str) -> _File | None:
        if rel not in self._files:
            text = self._cand_text(rel)
            self._files[rel] = _File.of(text) if text is not None else None
        return self._files[rel]

    def _linesets(self) -> list[tuple[str, frozenset]]:
        """(file, set of its stripped lines) for every changed candidate file, built once."""
        if self._sets is None:
            out = []
            for rel in self.changed:
                text = self._cand_text(rel)
                if text is not None:
                    out.append((rel, frozenset(map(str.strip, text.split("\n")))))
            self._sets = out
        return self._sets

    def heirs(self, rel: str) -> dict[str, float]:
        """Changed candidate files that took lines which left ``rel`` (share of the departed lines)."""
        if rel in self._heirs:
            return self._heirs[rel]
        pin = self._pin_text(rel)
        out: dict[str, float] = {}
        if pin is not None:
            departed = {s for s in map(str.strip, pin.split("\n")) if len(s) >= 12 and s not in _BORING}
            now = self._cand_text(rel)
            if now is not None:
                departed -= set(map(str.strip, now.split("\n")))
            # A sample of the most distinctive (longest) departed lines keeps this
            # one set lookup per line per file, whatever the size of the pin file.
            sample = frozenset(sorted(departed, key=lambda x: (-len(x), x))[:HEIR_SAMPLE])
            if sample:
                for other, lines in self._linesets():
                    if other == rel:
                        continue
                    n = len(sample & lines)  # C loop over the smaller set
                    if n:
                        out[other] = n / len(sample)
        # Keep the files that took a real share, not the ones sharing a boilerplate line.
        ranked = sorted(out.items(), key=lambda kv: -kv[1])[:8]
        self._heirs[rel] = {k: v for k, v in ranked if v >= 0.02}
        return self._heirs[rel]

    # -- the search -----------------------------------------------------------

    def suggest(self, anchor: str, file: str, qualname: str | None = None, pin_line: int | None = None,
                limit: int = 3) -> list[Suggestion]:
        """Up to ``limit`` ranked places on the candidate where ``anchor`` (from ``file``) most likely went.

        ``qualname`` and ``pin_line`` say where the anchor sat on the pin
        (enclosing ``Class.method``, first line); both are optional.
        """
        a_lines = anchor_lines(anchor)
        a_norm = "\n".join(s.strip() for s in a_lines)
        n = len(a_lines)
        keys = key_lines(a_lines)
        a_index: dict[str, list[int]] = {}
        for j, ln in enumerate(a_lines):
            a_index.setdefault(ln.strip(), []).append(j)
        pin_def = self._pin_def(file, qualname)
        hits: list[_Hit] = []

        same = self._file(file)
        best_same = 0.0
        if same is not None:
            for h in self._scan_file(file, same, a_norm, n, None):
                h.reasons.append("same file")
                hits.append(h)
                best_same = max(best_same, h.similarity)
        if best_same >= SAME_FILE_CONFIDENT:
            return self._rank(hits, file, qualname, {}, limit)
        heirs = self.heirs(file)
        wanted = list(keys)
        if pin_def is not None and pin_def[0] not in wanted:
            wanted.append(pin_def[0])
        seeded = self._global_seeds(wanted, keys, file, heirs)
        # Files that inherited most of the pin file's departed lines are scanned
        # whole: a renamed function or a rewritten signature leaves no exact seed.
        whole = [rel for rel, share in sorted(heirs.items(), key=lambda kv: -kv[1])[:3] if share >= 0.05]
        for rel in dict.fromkeys([*whole, *(r for r, _ in seeded)]):
            f = self._file(rel)
            if f is None:
                continue
            starts: set[int] | None = None
            if rel not in whole:
                starts = set()
                for i, key in f.where(set(dict(seeded)[rel])):
                    if key in a_index:
                        starts.update(i - j for j in a_index[key])
                    elif pin_def is not None and key == pin_def[0]:
                        # The enclosing def moved here: look through its body, around
                        # where the anchor sat relative to the def line on the pin.
                        _, def_line, end_line = pin_def
                        delta = (pin_line - def_line) if pin_line else 0
                        lo = i + max(0, delta - 20)
                        hi = i + max(delta + 20, min(end_line - def_line, 400))
                        starts.update(range(lo, hi + 1))
            for h in self._scan_file(rel, f, a_norm, n, starts):
                if rel in heirs:
                    h.reasons.append(f"content moved here from {file}")
                hits.append(h)
        return self._rank(hits, file, qualname, heirs, limit)

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

    def _global_seeds(self, wanted: list[str], keys: list[str], file: str, heirs: dict[str, float]):
        """(file, key lines it contains) for the best-matching changed files."""
        found: list[tuple[float, str, list[str]]] = []
        if not wanted:
            return []
        key_set = set(keys)
        for rel, lines in self._linesets():
            if rel == file:
                continue
            got = [k for k in wanted if k in lines]
            if not got:
                continue
            weight = sum(1.0 if k in key_set else 0.5 for k in got) + (0.5 if rel in heirs else 0.0)
            found.append((weight, rel, got))
        found.sort(key=lambda t: (-t[0], t[1]))
        return [(rel, got) for _, rel, got in found[:8]]

    def _scan_file(self, rel: str, f: _File, a_norm: str, n: int, starts: set[int] | None) -> list[_Hit]:
        """The best windows of ``f``: every start when ``starts`` is None, else around the seeds."""
        total = len(f.lines)
        if total == 0:
            return []
        size = max(1, min(n, total))
        if starts is None:
            cand_starts = range(0, max(1, total - size + 1))
        else:
            cand_starts = sorted({s for s in (x + d for x in starts for d in (-2, -1, 0, 1, 2))
                                  if 0 <= s <= max(0, total - 1)})
        if not cand_starts:
            return []
        windows = [f.window(s, size) for s in cand_starts]
        top = process.extract(a_norm, windows, scorer=fuzz.ratio, limit=6, score_cutoff=25)
        out: list[_Hit] = []
        taken: list[tuple[int, int]] = []
        for _, _, idx in top:
            s0 = cand_starts[idx]
            best = self._refine(f, a_norm, n, s0)
            s, k, sim = best
            if any(s < e and b < s + k for b, e in taken):
                continue
            taken.append((s, s + k))
            out.append(_Hit(rel, s, k, sim))
        return out

    @staticmethod
    def _refine(f: _File, a_norm: str, n: int, s0: int) -> tuple[int, int, float]:
        """Grow, shrink and shift a window: upstream edits add and drop lines."""
        total = len(f.lines)
        lo, hi = max(1, n - max(2, n // 3)), n + max(2, n // 2)
        best = (s0, n, -1.0)
        for ds in range(-3, 4):
            s = s0 + ds
            if s < 0 or s >= total:
                continue
            for k in range(lo, hi + 1):
                if s + k > total:
                    break
                sim = fuzz.ratio(a_norm, f.window(s, k))
                # Prefer the tighter window on ties: it is what a human would re-anchor on.
                if sim > best[2] + 1e-9 or (abs(sim - best[2]) <= 1e-9 and k < best[1]):
                    best = (s, k, sim)
        return best

    def _rank(self, hits: list[_Hit], file: str, qualname: str | None, heirs: dict[str, float],
              limit: int) -> list[Suggestion]:
        hits = [h for h in hits if h.similarity >= BONUS_FLOOR - 10]
        hits.sort(key=lambda h: -h.similarity)
        # Qualnames need a parse of the file: only for the front runners.
        shortlist = hits[: max(limit * 3, 6)]
        scored: list[tuple[float, float, Suggestion]] = []
        want_last = qualname.rsplit(".", 1)[-1] if qualname else None
        for h in shortlist:
            f = self._file(h.file)
            assert f is not None
            q = self._qualname(h.file, f, h.start, h.size)
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
            sim = h.similarity
            raw = sim + bonus if sim >= BONUS_FLOOR else sim  # ranked uncapped: a signal breaks a 100 tie
            score = min(100.0, raw)
            if score < MIN_SCORE or (not bonus and sim < MIN_COLD_SIMILARITY):
                continue
            if not reasons:
                reasons.append("similar text")
            text = "\n".join(f.lines[h.start:h.start + h.size]) + "\n"
            scored.append((raw, sim, Suggestion(file=h.file, line=h.start + 1, end_line=h.start + h.size,
                                                  qualname=q, score=int(round(score)), similarity=int(round(sim)),
                                                  reasons=tuple(reasons), text=text)))
        scored.sort(key=lambda t: (-t[0], -t[1], t[2].file, t[2].line))
        out: list[Suggestion] = []
        for _, _, sug in scored:
            if any(o.file == sug.file and o.line <= sug.end_line and sug.line <= o.end_line for o in out):
                continue
            if out and sug.score < out[0].score - RUNNER_UP_GAP:
                break  # far behind the best: noise to a reader
            out.append(sug)
            if len(out) == limit:
                break
        return out

    def _qualname(self, rel: str, f: _File, start: int, size: int) -> str:
        sc = self._scopes(f.text)
        # The first non-blank line decides: a window may start on a blank line before a def.
        for i in range(start, min(start + size, len(f.lines))):
            if f.norm[i]:
                return sc.qualname(i + 1)
        return sc.qualname(start + 1)
