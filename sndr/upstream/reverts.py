"""Revert pairing in an upstream range, in the forms vLLM's history takes.

vLLM squash-merges every PR, so a revert reads
``Revert "[Bugfix] Foo (#51234)" (#51300)``: the reverted subject keeps its
own PR suffix and the revert adds another. A revert is paired with the commit
it undoes by the first of these that finds one:

1. ``This reverts commit <sha>`` in the body (``git revert``'s own line), or
   ``Reverts owner/repo#N`` (GitHub's revert button) naming a PR of the range;
2. the subject: ``Revert "X"`` with every ``(#N)`` suffix stripped on both
   sides, the PR number of the inner subject preferred when several match;
3. the patch-id of the revert's diff equals the patch-id of the inverse diff
   of an earlier commit (a revert that does not say so).

A revert whose target is not in the range is reported as such. Chains
(a revert of a revert of ...) resolve to their net effect: the members pair
off from the newest, so an even number of reverts leaves the original
standing and an odd number cancels everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .gitio import CommitInfo

__all__ = ["RevertInfo", "pair_reverts", "pr_numbers", "revert_target_subject", "strip_pr"]

_PR_SUFFIX = re.compile(r"(?:\s*\(#\d+\))+\s*$")
_PR_NUM = re.compile(r"\(#(\d+)\)")
_REVERT = re.compile(r'^Revert\s+"(?P<inner>.*)"$', re.S)
_BODY_SHA = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_BODY_PR = re.compile(r"^Reverts\s+(?:[\w.-]+/[\w.-]+)?#(\d+)\s*$", re.M)


def strip_pr(subject: str) -> str:
    """``[Bugfix] Foo (#51234)`` -> ``[Bugfix] Foo``."""
    return _PR_SUFFIX.sub("", subject).strip()


def pr_numbers(subject: str) -> list[int]:
    return [int(n) for n in _PR_NUM.findall(subject)]


def revert_target_subject(subject: str) -> str | None:
    """The subject a ``Revert "..."`` subject names (its own PR suffix stripped), or None."""
    m = _REVERT.match(strip_pr(subject))
    return m.group("inner") if m else None


@dataclass
class RevertInfo:
    #: revert index -> the in-range commit it undoes
    target: dict[int, int] = field(default_factory=dict)
    #: revert index -> how it was paired: 'body', 'subject' or 'patch-id'
    how: dict[int, str] = field(default_factory=dict)
    #: revert index -> what it names outside the range (a sha, or the quoted subject)
    outside: dict[int, str] = field(default_factory=dict)
    #: in-range pairs that cancel: index -> partner
    partner: dict[int, int] = field(default_factory=dict)
    #: index -> the whole chain it belongs to (oldest first), for chains of three or more
    chain: dict[int, list[int]] = field(default_factory=dict)
    #: revert index -> the earlier revert of the same commit it duplicates
    again: dict[int, int] = field(default_factory=dict)


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
        if target is None:
            inner = revert_target_subject(c.subject)
            if inner is not None:
                hits = [j for j in by_subject.get(strip_pr(inner), []) if j < i]
                nums = pr_numbers(inner)
                if nums:
                    exact = [j for j in hits if nums[-1] in pr_numbers(commits[j].subject)]
                    hits = exact or hits
                if hits:
                    target, how = hits[-1], "subject"
                else:
                    info.outside[i] = f'"{inner}"'
                    continue
        if target is None and inverse_ids:
            iid = inverse_ids.get(c.sha)
            if iid:
                t = latest_before(by_fwd.get(iid, []), i)
                if t is not None:
                    target, how = t, "patch-id"
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
    return info
