"""Adopt one ``bench_gdn.py`` table run as PK0003's tables of record (CPU only, no torch).

A full run (``python3 benchmarks/bench_gdn.py --rep 40 --prebuild 16 --out RUN``) writes
``RUN/routing_wins.txt`` (the literal blocks ``WINS``, ``CUDA``, ``CUDA_SHAPES``) and ``RUN/bench_gdn.md``
(the target bullets, the graph / eager tables, the correctness table). This script writes them where
they are read, replacing text and editing nothing by hand:

* ``sndr/kernels/gdn/routing.py``: the three literal blocks;
* ``docs/bench-gdn-h200.md``: the literal block under "## Routing: the cells PK0003 takes", the four
  target bullets under "## Targets of issue 26 (graph replay), hits and misses" and every table from
  "### float32 state, CUDA-graph replay" to the end of the page.

The page's prose (the header's run, commit and command; the history sections) stays the author's to
write. ``tests/kernels/test_gdn_routing.py`` then checks that the routing tables equal the page's cells.

    python3 benchmarks/gdn_adopt_run.py RUN            # rewrite the two files
    python3 benchmarks/gdn_adopt_run.py RUN --check    # exit 1 when they differ from RUN
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUTING = Path("sndr/kernels/gdn/routing.py")
DOC = Path("docs/bench-gdn-h200.md")
NAMES = ("WINS", "CUDA", "CUDA_SHAPES")
ROUTING_HEAD = "## Routing: the cells PK0003 takes"
TARGETS_HEAD = "## Targets of issue 26 (graph replay), hits and misses\n\n"
TABLES_START = "\n### float32 state, CUDA-graph replay, "
RUN_ROUTING_HEAD = "## The routing tables of this run"
#: the run's target bullets, in the order bench_gdn.fmt_targets prints them
BULLETS = ("- **<= 0.97x", "- **>= 1.15x", "- **From batch 32", "- Cells where sndr / default printed")


class AdoptError(ValueError):
    """A file does not have the shape this script replaces in (says which file and what is missing)."""


def _block(text: str, name: str, where: str) -> re.Match:
    m = re.search(rf"^{re.escape(name)}: .*?^\}}\n", text, re.S | re.M)
    if not m:
        raise AdoptError(f"{where}: no `{name}: ... = {{ ... }}` literal block")
    return m


def _index(text: str, needle: str, where: str, start: int = 0) -> int:
    i = text.find(needle, start)
    if i < 0:
        raise AdoptError(f"{where}: no {needle.strip()!r}")
    return i


def new_routing(routing: str, wins: str, run: str = "routing_wins.txt") -> str:
    """routing.py's text with its three literal blocks replaced by the run's."""
    for name in NAMES:
        new, old = _block(wins, name, run), _block(routing, name, str(ROUTING))
        routing = routing[:old.start()] + new.group(0) + routing[old.end():]
    return routing


def new_doc(doc: str, md: str, run: str = "bench_gdn.md") -> str:
    """The page's text with the run's routing block, target bullets and tables."""
    lit = re.search(r"```\n(WINS:.*?)```\n", md, re.S)
    if not lit:
        raise AdoptError(f"{run}: no routing literal block")
    i = _index(doc, ROUTING_HEAD, str(DOC))
    j = _index(doc, "```\n", str(DOC), i)
    k = _index(doc, "```\n", str(DOC), j + 4)
    doc = doc[:j + 4] + lit.group(1) + doc[k:]
    lines = md.splitlines()
    bullets = []
    for head in BULLETS:
        found = [ln for ln in lines if ln.startswith(head)]
        if len(found) != 1:
            raise AdoptError(f"{run}: {len(found)} lines start with {head!r} (want 1)")
        bullets.append(found[0])
    a = _index(doc, TARGETS_HEAD, str(DOC)) + len(TARGETS_HEAD)
    b = a
    for head in BULLETS:  # the page's four bullets, in order, directly under the heading
        if not doc.startswith(head, b):
            raise AdoptError(f"{DOC}: the bullet {head!r} is not next under {TARGETS_HEAD.strip()!r}")
        b = doc.index("\n", b) + 1
    doc = doc[:a] + "\n".join(bullets) + "\n" + doc[b:]
    t0 = _index(md, TABLES_START, run) + 1
    t1 = _index(md, RUN_ROUTING_HEAD, run, t0)
    u0 = _index(doc, TABLES_START, str(DOC)) + 1
    return doc[:u0] + md[t0:t1].rstrip() + "\n"


def adopt(run_dir: Path, root: Path = ROOT, check: bool = False) -> list[Path]:
    """Write (or, with ``check``, only compare) both files from ``run_dir``; the files that differ. Both new
    texts are made before either is written: a run or a file this refuses leaves both as they were."""
    wins = (run_dir / "routing_wins.txt").read_text()
    md = (run_dir / "bench_gdn.md").read_text()
    texts = {}
    for rel, make in ((ROUTING, lambda t: new_routing(t, wins)), (DOC, lambda t: new_doc(t, md))):
        old = (root / rel).read_text()
        new = make(old)
        if new != old:
            texts[rel] = new
    if not check:
        for rel, new in texts.items():
            (root / rel).write_text(new)
    return list(texts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a bench_gdn.py --out directory (routing_wins.txt, bench_gdn.md)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a file differs from the run; write nothing")
    args = ap.parse_args(argv)
    try:
        changed = adopt(args.run, check=args.check)
    except (AdoptError, OSError) as exc:
        print(f"gdn_adopt_run: {exc}", file=sys.stderr)
        return 2
    for rel in changed:
        print(f"{'differs' if args.check else 'wrote'}: {rel}")
    if not changed:
        print("unchanged: the run's tables are the committed ones")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
