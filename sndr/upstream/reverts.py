"""Revert pairing in an upstream range, in the forms vLLM's history takes.

vLLM squash-merges every PR, so a revert reads
``Revert "[Bugfix] Foo (#51234)" (#51300)``: the reverted subject keeps its
own PR suffix and the revert adds another. A revert is paired with the commit
it undoes by the first of these that finds one:

1. ``This reverts commit <sha>`` in the body (``git revert``'s own line), or
   ``Reverts owner/repo#N`` (GitHub's revert button) naming a PR of the range;
2. the subject: ``Revert "X"`` with every ``(#N)`` suffix stripped on both
   sides, the PR number of the inner subject preferred when several match;
   GitHub's truncated titles (``Revert "[Bugfix] A long ti…" (#M)``, the
   closing quote cut off too) match by prefix, and the unquoted form
   (``Revert [Bugfix] Foo (#N)``) is read as well;
3. the PR number of the inner subject, when its text matches nothing (the
   original's title was edited before the merge);
4. the patch-id of the revert's diff equals the patch-id of the inverse diff
   of an earlier commit (a revert that does not say so, or whose subject
   names nothing of the range).

A revert whose target is not in the range is reported as such (the planner
then resolves it to the commit on the pin's side, comparing PR-stripped
subjects on both sides). Chains
(a revert of a revert of ...) resolve to their net effect: the members pair
off from the newest, so an even number of reverts leaves the original
standing and an odd number cancels everything.

A revert of a revert re-lands the original: ``Reapply "X (#N)" (#K)`` (git's
own subject for it), ``Revert "Revert "X (#N)" (#M)"``, or ``X (#K)`` again
with the revert's inverse diff. It pairs as a revert (of the revert), but it is
a re-land, and :attr:`RevertInfo.relands` says so: the one home of that rule,
which the queue's descriptions read. A commit that is no revert and pairs with
nothing, yet carries the title of a commit reverted before it (``X (#K)``, or
``Reapply "X (#N)"``, with a diff of its own), re-lands it too (judged as any
commit, never cancelled), when it touches one of the files the reverted commit
touched: a title reused for a change to other files (``[Misc] Fix typo``) is no
re-land, and :attr:`RevertInfo.title_reuse` names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: gitio imports this module's subject matching (Git.find_subject)
    from .gitio import CommitInfo

__all__ = ["RevertInfo", "pair_reverts", "parse_reapply", "parse_revert", "pr_numbers", "revert_target_subject", "strip_pr",
           "subject_matches", "truncated_prefix"]

_PR_SUFFIX = re.compile(r"(?:\s*\(#\d+\))+\s*$")
_PR_NUM = re.compile(r"\(#(\d+)\)")
_REVERT = re.compile(r'^Revert\s+"(?P<inner>.*?)"?$', re.S)
_REVERT_BARE = re.compile(r"^Revert\s+(?P<inner>[^\s\"].*)$", re.S)
#: GitHub cuts a long title and ends it with an ellipsis (U+2026, or three dots)
_TRUNCATED = re.compile(r"(?:\u2026|\.\.\.)\s*$")
_REAPPLY = re.compile(r'^Reapply\s+["\u201c](?P<inner>.*?)["\u201d]?$', re.S)
_BODY_SHA = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_BODY_PR = re.compile(r"^Reverts\s+(?:[\w.-]+/[\w.-]+)?#(\d+)\s*$", re.M)


def strip_pr(subject: str) -> str:
    """``[Bugfix] Foo (#51234)`` -> ``[Bugfix] Foo``."""
    return _PR_SUFFIX.sub("", subject).strip()


def pr_numbers(subject: str) -> list[int]:
    return [int(n) for n in _PR_NUM.findall(subject)]


def parse_revert(subject: str) -> tuple[str, bool, list[int]] | None:
    """A revert subject read: (the subject it names, whether it was quoted, the PR numbers that may be the
    original's), or None when ``subject`` is no revert.

    ``Revert "X (#N)" (#M)`` gives ``X (#N)``, quoted, ``[N]``; GitHub's
    truncated title keeps its ellipsis (:func:`truncated_prefix`); the
    unquoted ``Revert X (#N) (#M)`` gives ``X``, unquoted, ``[N]`` (or
    ``[M]`` when it carries one number: it may be either PR's).
    """
    s = strip_pr(subject)
    m = _REVERT.match(s) if s.startswith('Revert "') else None
    if m is None and s.startswith("Revert \u201c"):
        m = re.match(r"^Revert\s+\u201c(?P<inner>.*?)\u201d?$", s, re.S)
    if m is not None:
        inner = m.group("inner")
        if not s.endswith(('"', "\u201d")) and not _TRUNCATED.search(inner):
            # No closing quote: the subject was cut (a tool's line limit, no ellipsis), maybe inside the PR
            # suffix (`Revert "Title (#12`): keep the words, drop a partial suffix and mark it cut, so it
            # pairs by prefix as GitHub's own ellipsis does (truncated_prefix).
            inner = re.sub(r"\s*\(#?\d*$", "", inner).rstrip() + "\u2026"
        return inner, True, pr_numbers(inner)[-1:]
    m = _REVERT_BARE.match(s)
    if m is None:
        return None
    nums = pr_numbers(subject)
    return m.group("inner").strip(), False, nums[-2:-1] or nums[-1:]


def parse_reapply(subject: str) -> str | None:
    """The subject a ``Reapply "X (#N)" (#K)`` subject names (git's subject for a revert of a revert), or None."""
    m = _REAPPLY.match(strip_pr(subject))
    return m.group("inner") if m else None


def revert_target_subject(subject: str) -> str | None:
    """The subject a ``Revert "..."`` subject names (its own PR suffix stripped), or None."""
    r = parse_revert(subject)
    return r[0] if r else None


def truncated_prefix(inner: str) -> str | None:
    """The kept start of a title GitHub truncated (``...`` or an ellipsis at its end), or None."""
    if not _TRUNCATED.search(inner):
        return None
    kept = _TRUNCATED.sub("", inner).rstrip()
    return kept if len(kept) >= 8 else None


def subject_matches(inner: str, subject: str) -> bool:
    """Whether ``subject`` is the one a revert's inner subject names (PR suffixes stripped on both sides;
    a truncated inner subject by prefix)."""
    a, b = strip_pr(inner), strip_pr(subject)
    if a == b:
        return True
    kept = truncated_prefix(inner)
    return kept is not None and b.startswith(kept)


@dataclass
class RevertInfo:
    #: revert index -> the in-range commit it undoes
    target: dict[int, int] = field(default_factory=dict)
    #: revert index -> how it was paired: 'body', 'subject', 'PR number' or 'patch-id'
    how: dict[int, str] = field(default_factory=dict)
    #: revert index -> what it names outside the range (a sha, or the quoted subject)
    outside: dict[int, str] = field(default_factory=dict)
    #: outside reverts read from an unquoted ``Revert X``: a claim only when X is found before the pin
    unquoted: set[int] = field(default_factory=set)
    #: in-range pairs that cancel: index -> partner
    partner: dict[int, int] = field(default_factory=dict)
    #: index -> the whole chain it belongs to (oldest first), for chains of three or more
    chain: dict[int, list[int]] = field(default_factory=dict)
    #: revert index -> the earlier revert of the same commit it duplicates
    again: dict[int, int] = field(default_factory=dict)
    #: re-land index -> (the commit it lands again, the revert of that commit it follows): a revert of that
    #: revert (paired: also in ``target``), or a commit with the reverted commit's title (not paired)
    relands: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: re-land index -> how it was found: 'paired by <how>' (a revert of the revert), 'same title and files', or
    #: 'same title' (one of the two touches no mirrored file: nothing to compare)
    reland_how: dict[int, str] = field(default_factory=dict)
    #: index -> the reverted commit whose title it carries although it touches none of that commit's files (a
    #: reused title, not a re-land: judged as any commit)
    title_reuse: dict[int, int] = field(default_factory=dict)


def pair_reverts(commits: list[CommitInfo], candidates: set[int] | None = None,
                 forward_ids: dict[str, str] | None = None,
                 inverse_ids: dict[str, str] | None = None) -> RevertInfo:
    """Find the reverts among ``commits`` (``candidates``: the indices that may pair; default all)."""
    cands = set(range(len(commits))) if candidates is None else set(candidates)
    by_sha = {c.sha: i for i, c in enumerate(commits)}
    by_subject: dict[str, list[int]] = {}
    by_pr: dict[int, list[int]] = {}
    by_fwd: dict[str, list[int]] = {}
    info = RevertInfo()
    for i, c in enumerate(commits):
        if i in cands:
            by_subject.setdefault(strip_pr(c.subject), []).append(i)
            for n in pr_numbers(c.subject)[-1:]:
                by_pr.setdefault(n, []).append(i)
            fid = (forward_ids or {}).get(c.sha)
            if fid:
                by_fwd.setdefault(fid, []).append(i)

    def latest_before(idx: list[int], i: int) -> int | None:
        hits = [j for j in idx if j < i]
        return hits[-1] if hits else None

    for i, c in enumerate(commits):
        if i not in cands:
            continue
        target = None
        m = _BODY_SHA.search(c.body)
        if m:
            pref = m.group(1)
            hits = [j for s, j in by_sha.items() if s.startswith(pref) and j < i]
            if hits:
                target, how = hits[0], "body"
            else:
                info.outside[i] = pref
                continue
        if target is None:
            m = _BODY_PR.search(c.body)
            if m:
                target = latest_before(by_pr.get(int(m.group(1)), []), i)
                how = "body"
        parsed = parse_revert(c.subject) if target is None else None
        if parsed is not None:
            inner, quoted, nums = parsed
            hits = [j for j in by_subject.get(strip_pr(inner), []) if j < i]
            kept = truncated_prefix(inner)
            if not hits and kept is not None:
                hits = [j for j in sorted(cands) if j < i and subject_matches(inner, commits[j].subject)]
            if nums:
                exact = [j for j in hits if nums[-1] in pr_numbers(commits[j].subject)]
                hits = exact or hits
            if hits:
                target, how = hits[-1], "subject"
            elif nums and (t := latest_before(by_pr.get(nums[-1], []), i)) is not None:
                target, how = t, "PR number"  # the title was edited, the PR is the same
        if target is None and inverse_ids:
            iid = inverse_ids.get(c.sha)
            if iid:
                t = latest_before(by_fwd.get(iid, []), i)
                if t is not None:
                    target, how = t, "patch-id"
        if target is None and parsed is not None:
            info.outside[i] = f'"{parsed[0]}"'
            if not parsed[1]:
                info.unquoted.add(i)
            continue
        if target is None or target not in cands:
            continue
        info.target[i] = target
        info.how[i] = how

    # chains: follow each original through the reverts of its reverts
    reverted_by: dict[int, int] = {}
    for i in sorted(info.target):
        t = info.target[i]
        if t in reverted_by:
            info.again[i] = reverted_by[t]
            continue
        reverted_by[t] = i
    roots = [t for t in reverted_by if t not in info.target or info.target[t] in info.again]
    for root in sorted(roots):
        chain = [root]
        while chain[-1] in reverted_by:
            chain.append(reverted_by[chain[-1]])
        k = len(chain) - 1
        while k >= 1:  # pair off from the newest
            a, b = chain[k - 1], chain[k]
            info.partner[a], info.partner[b] = b, a
            k -= 2
        if len(chain) > 2:
            for j in chain:
                info.chain[j] = chain
        for k in range(2, len(chain), 2):  # every other member after the root reverts a revert of it
            info.relands[chain[k]] = (root, chain[k - 1])
            info.reland_how[chain[k]] = f"paired by {info.how[chain[k]]}"
    _relands_by_title(commits, cands, info, reverted_by, by_subject)
    return info


def _files(c: CommitInfo) -> set[str]:
    """The mirrored files a commit touches (both paths of a rename or copy)."""
    return {p for ch in c.changes for p in ch.paths}


def _relands_by_title(commits: list[CommitInfo], cands: set[int], info: RevertInfo, reverted_by: dict[int, int],
                      by_subject: dict[str, list[int]]) -> None:
    """Commits that pair with nothing but carry the title of an earlier commit that stands reverted when they
    land (``X (#K)`` or ``Reapply "X (#N)"`` after ``Revert "X (#N)"``) and touch one of its files: re-lands, with
    a diff of their own. The same title on a change to none of its files is a reused title (``title_reuse``)."""
    for i in sorted(cands):
        if i in info.target or i in info.outside:  # a revert (a paired revert of a revert is found above)
            continue
        subject = commits[i].subject
        if parse_revert(subject) is not None:
            continue
        title = strip_pr(parse_reapply(subject) or subject)
        for j in reversed([j for j in by_subject.get(title, []) if j < i]):
            chain = [j]
            while chain[-1] in reverted_by and reverted_by[chain[-1]] < i:
                chain.append(reverted_by[chain[-1]])
            if len(chain) % 2 == 0:  # reverted (an odd number of reverts) when i lands
                mine, theirs = _files(commits[i]), _files(commits[j])
                if mine and theirs and not mine & theirs:
                    info.title_reuse[i] = j
                    break
                info.relands[i] = (j, chain[-1])
                info.reland_how[i] = "same title and files" if mine and theirs else "same title"
                break
