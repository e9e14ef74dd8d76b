"""Independent oracle for relocation tests and the preflight benchmark: difflib alone.

Shared by tests/preflight/test_preflight.py and benchmarks/bench_preflight.py so the
accuracy a test asserts and the accuracy the benchmark reports are measured
against the same truth.
"""

from __future__ import annotations

import difflib


def true_location(anchor: str, file: str, pin: dict[str, str], cand: dict[str, str]):
    """Where the anchor's code is on the candidate, found by difflib alone.

    Over the anchor's own file and every file that is new on the candidate,
    take difflib's matching blocks between the anchor's lines and the file's
    (indentation ignored) and find the tightest cluster (spanning at most
    twice the anchor's length) that holds the most of the anchor's
    non-trivial lines. None when no cluster holds half of them: the code is
    gone. A one-line anchor that was rewritten falls back to the closest
    line by ratio.
    """
    a = [x.strip() for x in anchor.rstrip("\n").split("\n")]
    need = max(1, (sum(1 for x in a if len(x) >= 8) + 1) // 2)
    best = None
    for rel in [file, *sorted(set(cand) - set(pin))]:
        if rel not in cand:
            continue
        b = [x.strip() for x in cand[rel].split("\n")]
        blocks = [m for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks() if m.size]
        for i, first in enumerate(blocks):
            size, last = 0, first
            for m in blocks[i:]:
                if m.b + m.size > first.b + 2 * len(a):
                    break
                size += sum(1 for x in a[m.a:m.a + m.size] if len(x) >= 8)
                last = m
            if size >= need and (best is None or size > best[0]):
                best = (size, rel, first.b + 1, last.b + last.size)
    if best is None and len(a) == 1:
        # One line, rewritten (a renamed def): the closest line by difflib's ratio.
        scored = [(difflib.SequenceMatcher(None, a[0], x).ratio(), rel, i + 1)
                  for rel in [file, *sorted(set(cand) - set(pin))] if rel in cand
                  for i, x in enumerate(cand[rel].split("\n")) if difflib.SequenceMatcher(None, a[0], x).real_quick_ratio() > 0.85]
        top = max(scored, default=None)
        if top and top[0] >= 0.85:
            return top[1], top[2], top[2]
    return None if best is None else best[1:]
