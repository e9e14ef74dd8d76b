"""Vendor round trip over every .py file that differs between two vLLM releases.

For each file changed between the pin and the candidate (default 0.32.0 and
0.33.0), make a difflib unified diff, vendor it against the pin with
``sndr vendor``'s core, and check independently that:

* the written TOML loads back to the same patch;
* planning the patch on the pin's file reproduces the candidate's file byte-exactly;
* planning it over the candidate's file reads ``applied`` or ``merged`` for every edit.

Files new in the candidate are vendored as ``create`` entries and checked the
same way. Prints success, refusals grouped by reason, failures, edit
statistics and time::

    python benchmarks/bench_vendor_roundtrip.py                 # the full corpus
    python benchmarks/bench_vendor_roundtrip.py --sample 100    # a seeded sample
    python benchmarks/bench_vendor_roundtrip.py --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sndr.tree import fetch_version  # noqa: E402
from sndr.upstream.vendor import DEFAULT_MAX_CONTEXT, roundtrip_result  # noqa: E402


def changed(pin: Path, cand: Path) -> tuple[list[str], list[str]]:
    a = {p.relative_to(pin).as_posix() for p in (pin / "vllm").rglob("*.py")}
    b = {p.relative_to(cand).as_posix() for p in (cand / "vllm").rglob("*.py")}
    modified = sorted(r for r in a & b if (pin / r).read_bytes() != (cand / r).read_bytes())
    return modified, sorted(b - a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pin", default="0.32.0")
    ap.add_argument("--candidate", default="0.33.0")
    ap.add_argument("--sample", type=int, default=0, help="check only a seeded sample of N changed files")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--no-added", action="store_true", help="skip files that are new in the candidate")
    ap.add_argument("--max-context", type=int, default=DEFAULT_MAX_CONTEXT)
    ap.add_argument("--json", metavar="FILE", help="write per-file results as JSON")
    args = ap.parse_args(argv)

    pin, cand = fetch_version(args.pin), fetch_version(args.candidate)
    modified, added = changed(pin, cand)
    if args.no_added:
        added = []
    work = [(r, "modified") for r in modified] + [(r, "added") for r in added]
    if args.sample:
        work = random.Random(args.seed).sample(work, min(args.sample, len(work)))

    status = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    refusals = collections.defaultdict(list)
    wrong = []
    stats = collections.Counter()
    widest = collections.Counter()
    times = []
    rows = []
    t0 = time.perf_counter()
    for rel, kind in work:
        old = (pin / rel).read_bytes().decode() if kind == "modified" else None
        new = (cand / rel).read_bytes().decode()
        t = time.perf_counter()
        st, reason, res = roundtrip_result(rel, old, new, version=args.pin, max_context=args.max_context)
        dt = time.perf_counter() - t
        times.append((dt, rel))
        status[st] += 1
        by_kind[kind][st] += 1
        if st == "refused":
            for p in res.problems:
                refusals[p.code].append(f"{rel}: {p.message}")
        elif st == "wrong":
            wrong.append(f"{rel}: {reason}")
        for e in res.edits:
            stats["edits"] += 1
            stats["widened"] += e.widened
            stats["no marker"] += e.marker is None
            stats["pair marker"] += bool(e.marker and "\n" in e.marker)
            widest[max(e.context_before, e.context_after)] += 1
        stats["created"] += len(res.created)
        rows.append({"file": rel, "kind": kind, "status": st, "reason": reason, "seconds": round(dt, 4),
                     "edits": len(res.edits), "widened": sum(e.widened for e in res.edits)})
    total = time.perf_counter() - t0

    n = len(work)
    print(f"vendor round trip vllm {args.pin} -> {args.candidate}: {n} files "
          f"({sum(k == 'modified' for _, k in work)} modified, {sum(k == 'added' for _, k in work)} added)")
    print(f"  ok {status['ok']}/{n}  refused {status['refused']}  wrong {status['wrong']}")
    for kind, c in sorted(by_kind.items()):
        print(f"    {kind:<9} ok {c['ok']}  refused {c['refused']}  wrong {c['wrong']}")
    print(f"  edits {stats['edits']}  widened beyond the diff's context {stats['widened']}  "
          f"without a merged marker {stats['no marker']}  pair markers {stats['pair marker']}  "
          f"created files {stats['created']}")
    print("  context lines an anchor needed (max of before/after): "
          + ", ".join(f"{k}:{v}" for k, v in sorted(widest.items())))
    for code, items in sorted(refusals.items()):
        print(f"  refused ({code}): {len(items)}")
        for item in items[:5]:
            print(f"    {item}")
    for item in wrong[:20]:
        print(f"  WRONG {item}")
    times.sort()
    if times:
        p50 = times[len(times) // 2][0]
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))][0]
        print(f"  time {total:.1f}s total, per file p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
              f"max {times[-1][0] * 1000:.0f} ms ({times[-1][1]})")
    if args.json:
        Path(args.json).write_text(json.dumps({"pin": args.pin, "candidate": args.candidate, "files": n,
                                               "status": dict(status), "stats": dict(stats),
                                               "seconds": round(total, 2), "results": rows}, indent=2) + "\n")
    return 0 if not wrong and not status["refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
