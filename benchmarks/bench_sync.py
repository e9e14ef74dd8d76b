"""Benchmark: ``sync plan`` on a large scripted history of vLLM's shape (issue 17).

vLLM's own history cannot be fetched here. ``tests/upstream/history.py``
generates one with its shapes on the real vLLM 0.32.0 files: squash-merged
subjects ``[Tag] Title (#N)``, squash-form reverts (subject, ``Reverts
vllm-project/vllm#N`` body, and silent ones), revert chains, pure additions,
rewrites of recent lines, renames, and release branches ``releases/v0.32`` and
``releases/v0.33`` with cherry-picks from main, tagged ``v0.32.0`` and
``v0.33.0`` (neither an ancestor of the other). By default the branches are cut
at 5% and 90% of main, so the range holds most of the history.

The script plans ``v0.32.0..v0.33.0`` against the v0.32.0 tree with the
shipped patch set's surface, and prints every count with what it counts and
the wall time, next to the time ``git log -p v0.32.0..v0.33.0`` takes to
merely print the range (the floor any planner reading the diffs pays).

    python benchmarks/bench_sync.py [--commits 2600] [--others 300] [--cuts 0.05 0.90] [--keep DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from upstream.history import generate, git  # noqa: E402

from sndr.load import load_patch_set  # noqa: E402
from sndr.tree import DirTree, fetch_version  # noqa: E402
from sndr.upstream.queue import Surface, patch_surface, plan_queue  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=2600)
    ap.add_argument("--cuts", type=float, nargs=2, default=(0.05, 0.90), metavar=("V032", "V033"),
                    help="where on main the two release branches are cut (fractions)")
    ap.add_argument("--others", type=int, default=300, help="real files outside the surface")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--local", type=int, default=25, help="lines of the tree changed locally (as local patches "
                    "do) where a range commit edits them: each makes that commit a conflict")
    ap.add_argument("--keep", metavar="DIR", help="build the repository here and keep it")
    ap.add_argument("--json", metavar="OUT", help="write the numbers as JSON")
    args = ap.parse_args()

    pin_root = fetch_version("0.32.0")
    surface = sorted(patch_surface(load_patch_set(None).patches))
    pool = sorted(str(p.relative_to(pin_root)) for p in (pin_root / "vllm").rglob("*.py")
                  if str(p.relative_to(pin_root)) not in surface and p.stat().st_size > 2000)
    others = random.Random(args.seed).sample(pool, min(args.others, len(pool)))

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sndr-bench-sync-"))
    repo, tree = work / "vllm", work / "tree"
    for d in (repo, tree):
        if d.exists():
            shutil.rmtree(d)
    t0 = time.perf_counter()
    gen = generate(pin_root, surface, others, args.commits, seed=args.seed, cuts=tuple(args.cuts))
    gen.history.write(repo)
    t_build = time.perf_counter() - t0
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", "v0.32.0"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    total = int(git(repo, "rev-list", "--count", "--all"))
    in_range = set(git(repo, "rev-list", "v0.32.0..v0.33.0").split())
    rnd = random.Random(args.seed)
    local = 0
    for c in rnd.sample(gen.history.commits, len(gen.history.commits)):
        if local >= args.local:
            break
        if c.sha not in in_range or len(c.edits) != 1 or c.edits[0][0] not in gen.surface or not c.edits[0][1]:
            continue
        path, old, _new = c.edits[0]
        f = tree / path
        text = f.read_text(encoding="utf-8", errors="surrogateescape") if f.is_file() else ""
        first = old.split("\n", 1)[0]
        if text.count(old) == 1 and first.strip():
            f.write_text(text.replace(old, old.replace(first, first + "  # local patch", 1)),
                         encoding="utf-8", errors="surrogateescape")
            local += 1

    t0 = time.perf_counter()
    subprocess.run(["git", "-C", str(repo), "log", "-p", "v0.32.0..v0.33.0"], check=True, stdout=subprocess.DEVNULL)
    t_log = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = plan_queue(repo, "v0.32.0", "v0.33.0", Surface(set(gen.surface)), DirTree(tree))
    t_plan = time.perf_counter() - t0

    c = rep.counts
    print(f"history: {total} commits in the repository ({gen.counts['commits']} scripted: "
          f"{gen.counts['surface_edits']} surface edits, {gen.counts['outside_edits']} outside edits, "
          f"{gen.counts['additions']} added functions, {gen.counts['rewrites']} rewrites, {gen.counts['renames']} "
          f"renames, {gen.counts['reverts']} reverts, {gen.counts['picks']} cherry-picks onto release branches); "
          f"built in {t_build:.1f} s")
    print(f"tree: v0.32.0 with {local} lines changed locally where range commits edit them")
    print(f"range v0.32.0..v0.33.0: {c['commits']} commits (merge-base {rep.merge_base[:10]}, "
          f"{len(rep.pin_side)} commits on the pin's release branch only), {c['mirrored']} on the "
          f"{len(rep.surface.files)}-file surface")
    print(f"dispositions: {c.get('satisfied', 0)} satisfied, {c.get('applicable', 0)} applicable, "
          f"{c.get('review', 0)} review, {c.get('conflict', 0)} conflict, {c.get('outside', 0)} outside commits")
    print(f"statuses: {c['queued']} queued commits in {len(rep.waves)} waves; "
          + ", ".join(f"{v} {k.split(':', 1)[1]}" for k, v in sorted(c.items()) if k.startswith("status:")))
    print(f"identity: {c['cherry_picked']} commits cherry-picked onto the pin's branch (satisfied), "
          f"{c['reverts_paired']} reverts paired inside the range, {c['relands']} re-lands of a reverted commit, "
          f"{c['reverts_outside']} reverts of commits outside it")
    print(f"time: sync plan {t_plan:.1f} s; git log -p of the range {t_log:.2f} s "
          f"(plan/log = {t_plan / t_log:.0f}x); {1000 * t_plan / max(1, c['commits']):.1f} ms per commit")
    if args.json:
        Path(args.json).write_text(json.dumps({"repository_commits": total, "generated": gen.counts,
                                               "counts": c, "waves": len(rep.waves), "plan_s": t_plan,
                                               "git_log_s": t_log, "build_s": t_build}, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
