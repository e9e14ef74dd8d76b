"""Apply / verify / revert benchmark on real vLLM 0.32.0 files, against git apply and GNU patch.

    python benchmarks/bench_apply.py [--files 16] [--per-file 4] [--repeat 7]

Builds a patch set of files*per-file edits (a comment inserted after unique
def/class lines) over real files of the 0.32.0 tree, expresses the same change
as one unified diff, and times on fresh copies, in one run:

- sndr apply in-process (run_apply: plan + journal + fsync + ledger) and as a
  CLI process (python -m sndr.apply), against `git apply` and GNU `patch -p1`;
- sndr verify (ledger hash check) in-process and as a CLI process: cold (a fresh tree: the full verifier)
  and warm (the fast path of sndr/startup/verify.py; target <= 150 ms, python's own start included);
- sndr revert in-process.

Then (issue 16) a patch *stack* of 250 patches / 500 edits / 100 files
(``--stack-files 100``): per file two or three patches in a fixed ``after``
order, the later ones anchoring on text the earlier ones produced, plus
insertions at the edge of another patch's anchor. It reports dry-run, apply,
verify and revert times in-process, per edit, against the same figures of the
64-edit set measured in this run (target: within 2x per edit).

Ratios are printed against the named baselines measured in the same run; on
this shared 2-core machine absolute times mean little.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sndr.apply import run_apply, run_revert, run_verify  # noqa: E402
from sndr.load import load_patch_set  # noqa: E402
from sndr.tree import fetch_version  # noqa: E402

_DEF = re.compile(r"^ *(?:async def|def|class) [A-Za-z_][A-Za-z0-9_]*[(:].*$", re.M)


def pick_files(pin: Path, n: int, per_file: int) -> list[str]:
    out = []
    for p in sorted((pin / "vllm" / "v1").rglob("*.py")):
        text = p.read_text()
        if 20_000 < len(text) < 400_000 and len(_unique_defs(text)) >= per_file * 2:
            out.append(str(p.relative_to(pin)))
        if len(out) == n:
            break
    return out


def _unique_defs(text: str) -> list[str]:
    lines = [m.group(0) + "\n" for m in _DEF.finditer(text)]
    return [ln for ln in lines if text.count(ln) == 1]


def build(pin: Path, files: list[str], per_file: int, out: Path) -> tuple[Path, Path, int]:
    patches = out / "patches"
    patches.mkdir(parents=True)
    diff_chunks = []
    n_edits = 0
    for i, rel in enumerate(files):
        text = (pin / rel).read_text()
        defs = _unique_defs(text)
        step = max(1, len(defs) // per_file)
        chosen = defs[::step][:per_file]
        body = [f'id = "B{i:04d}"', f'title = "bench {rel}"', "", "[[files]]", f'path = "{rel}"', ""]
        new = text
        for j, line in enumerate(chosen):
            indent = line[: len(line) - len(line.lstrip())]
            repl = f"{line}{indent}# sndr bench marker {i}.{j}\n"
            body += ["[[files.edits]]", f'name = "e{j}"', f"anchor = '''\n{line}'''", f"replacement = '''\n{repl}'''", ""]
            new = new.replace(line, repl, 1)
            n_edits += 1
        (patches / f"B{i:04d}.toml").write_text("\n".join(body))
        diff_chunks.append("".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                        f"a/{rel}", f"b/{rel}")))
    diff = out / "set.diff"
    diff.write_text("".join(diff_chunks))
    return patches, diff, n_edits


def build_stack(pin: Path, files: list[str], out: Path) -> tuple[Path, int, int]:
    """250 patches / 500 edits over 100 files: stacked by ``after``, with edge insertions.

    Files 0..49: A (2 edits), B after A (one edit on A's produced line, one on another
    def), C (inserts before A's first anchor, unordered). Files 50..99: A (3 edits), B
    after A (2 edits, one stacked on A's produced line).
    """
    patches = out / "stack"
    patches.mkdir(parents=True)
    n_patches = n_edits = 0
    q = "'" * 3

    def write(pid: str, title: str, rel: str, edits: list[tuple[str, str]], top: str = "") -> None:
        nonlocal n_patches, n_edits
        body = [f'id = "{pid}"', f'title = "{title}"'] + ([top] if top else []) + ["", "[[files]]", f'path = "{rel}"', ""]
        for j, (a, r) in enumerate(edits):
            body += ["[[files.edits]]", f'name = "e{j}"', f"anchor = {q}\n{a}{q}", f"replacement = {q}\n{r}{q}", ""]
        (patches / f"{pid}.toml").write_text("\n".join(body))
        n_patches += 1
        n_edits += len(edits)

    for i, rel in enumerate(files):
        defs = _unique_defs((pin / rel).read_text())
        ind = [d[: len(d) - len(d.lstrip())] for d in defs]
        a_mark = f"{ind[0]}# stack A{i} marker\n"
        if i < len(files) // 2:
            write(f"A{i:03d}", f"A {rel}", rel, [(defs[0], defs[0] + a_mark), (defs[2], defs[2] + f"{ind[2]}# A{i}.1\n")])
            write(f"B{i:03d}", f"B {rel}", rel, [(a_mark, a_mark + f"{ind[0]}# B{i} stacked on A{i}\n"),
                                                  (defs[4], defs[4] + f"{ind[4]}# B{i}.1\n")], top=f'after = ["A{i:03d}"]')
            write(f"C{i:03d}", f"C {rel}", rel, [(defs[0], f"{ind[0]}# C{i} at the edge of A{i}'s anchor\n" + defs[0])])
        else:
            write(f"A{i:03d}", f"A {rel}", rel, [(defs[0], defs[0] + a_mark), (defs[2], defs[2] + f"{ind[2]}# A{i}.1\n"),
                                                  (defs[4], defs[4] + f"{ind[4]}# A{i}.2\n")])
            write(f"B{i:03d}", f"B {rel}", rel, [(a_mark, a_mark + f"{ind[0]}# B{i} stacked on A{i}\n"),
                                                  (defs[6], defs[6] + f"{ind[6]}# B{i}.1\n")], top=f'after = ["A{i:03d}"]')
    return patches, n_patches, n_edits


def pick_stack_files(pin: Path, n: int) -> list[str]:
    out = []
    for p in sorted((pin / "vllm").rglob("*.py")):
        text = p.read_text()
        if 5_000 < len(text) < 400_000 and len(_unique_defs(text)) >= 8:
            out.append(str(p.relative_to(pin)))
        if len(out) == n:
            break
    return out


def copy(pin: Path, files: list[str], dst: Path) -> Path:
    for rel in files + ["vllm/__init__.py", "vllm/version.py", "vllm/_version.py"]:
        d = dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pin / rel, d)
    for info in pin.glob("*.dist-info"):
        shutil.copytree(info, dst / info.name)
    return dst


def cpu_time(fn, repeat: int) -> float:
    """Least user + sys CPU seconds of the child processes ``fn`` runs, over ``repeat`` runs."""
    import resource

    best = float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        fn()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return best


def timed(fn, prepare, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        arg = prepare()
        t = time.perf_counter()
        fn(arg)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--per-file", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--stack-files", type=int, default=100, help="files of the 250-patch stack (0: skip it)")
    ap.add_argument("--stack-repeat", type=int, default=3)
    args = ap.parse_args()
    pin = fetch_version("0.32.0")
    work = Path(tempfile.mkdtemp(prefix="sndr-bench-apply-"))
    files = pick_files(pin, args.files, args.per_file)
    patches, diff, n_edits = build(pin, files, args.per_file, work)
    patch_set = load_patch_set(patches, packs=False)
    counter = iter(range(10**6))

    def fresh() -> Path:
        return copy(pin, files, work / f"t{next(counter)}")

    def patched() -> Path:
        d = fresh()
        assert run_apply(d, patch_set).ok
        return d

    results = {}
    results["git apply"] = timed(lambda d: subprocess.run(["git", "apply", str(diff)], cwd=d, check=True),
                                 fresh, args.repeat)
    results["GNU patch -p1"] = timed(lambda d: subprocess.run(["patch", "-p1", "-s", "-i", str(diff)], cwd=d, check=True),
                                     fresh, args.repeat)
    results["sndr apply (in-process)"] = timed(lambda d: run_apply(d, patch_set), fresh, args.repeat)
    results["sndr apply (CLI process)"] = timed(
        lambda d: subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(d), "--patches", str(patches), "-q"],
                                 check=True, cwd=ROOT), fresh, args.repeat)
    results["sndr verify (in-process)"] = timed(lambda d: run_verify(d, patch_set), patched, args.repeat)
    results["sndr verify (CLI process)"] = timed(
        lambda d: subprocess.run([sys.executable, "-m", "sndr.apply", "--tree", str(d), "--patches", str(patches),
                                  "--verify", "-q"], check=True, cwd=ROOT), patched, args.repeat)
    # The warm fast path (sndr/startup/verify.py): one tree, verified once so the memos hold its version and
    # resolved set (every vLLM process's memo), then timed. Issue 19's target: <= 150 ms on a quiet machine.
    warm_tree = patched()
    verify_cmd = [sys.executable, "-m", "sndr.apply", "--tree", str(warm_tree), "--patches", str(patches), "--verify",
                  "-q"]
    bench_env = dict(os.environ, SNDR_CACHE_DIR=str(work / "cache"))
    subprocess.run(verify_cmd, check=True, cwd=ROOT, env=bench_env)
    results["sndr verify (CLI process, warm)"] = timed(
        lambda _: subprocess.run(verify_cmd, check=True, cwd=ROOT, env=bench_env), lambda: None, args.repeat)
    results["python startup (python -c pass)"] = timed(
        lambda _: subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=ROOT), lambda: None, args.repeat)
    results["sndr revert (in-process)"] = timed(lambda d: run_revert(d), patched, args.repeat)
    results["python startup + import sndr.apply"] = timed(
        lambda _: subprocess.run([sys.executable, "-c", "import sndr.apply"], check=True, cwd=ROOT), lambda: None, args.repeat)

    # Correctness of the comparison: all three tools produce the same bytes.
    a, b, c = fresh(), fresh(), fresh()
    run_apply(a, patch_set)
    subprocess.run(["git", "apply", str(diff)], cwd=b, check=True)
    subprocess.run(["patch", "-p1", "-s", "-i", str(diff)], cwd=c, check=True)
    same = all((a / f).read_bytes() == (b / f).read_bytes() == (c / f).read_bytes() for f in files)

    print(f"vLLM 0.32.0: {len(files)} files, {n_edits} edits, diff {diff.stat().st_size // 1024} KiB; "
          f"median of {args.repeat}; outputs identical across tools: {same}")
    git = results["git apply"]
    for name, t in results.items():
        print(f"  {name:<38} {t * 1000:8.1f} ms   {t / git:5.2f}x git apply")
    print(f"  verify in-process target < 20 ms: {'met' if results['sndr verify (in-process)'] < 0.020 else 'MISSED'}")
    warm = results["sndr verify (CLI process, warm)"]
    print(f"  verify CLI process (warm) target <= 150 ms: {'met' if warm <= 0.150 else 'MISSED'} "
          f"({warm * 1000:.0f} ms, of which {results['python startup (python -c pass)'] * 1000:.0f} ms is the "
          f"interpreter's own start)")
    # CPU time (user + sys) of the same processes: what the wall time is on a quiet machine, and what a
    # loaded one (CI, a shared box) still measures faithfully.
    warm_cpu = cpu_time(lambda: subprocess.run(verify_cmd, check=True, cwd=ROOT, env=bench_env), args.repeat)
    bare_cpu = cpu_time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=ROOT), args.repeat)
    print(f"  verify CLI process (warm) CPU time {warm_cpu * 1000:.0f} ms (python -c pass: {bare_cpu * 1000:.0f} ms); "
          f"target <= 150 ms: {'met' if warm_cpu <= 0.150 else 'MISSED'}")
    ok = same
    if args.stack_files:
        small = {"dry-run": timed(lambda d: run_apply(d, patch_set, dry_run=True), fresh, args.repeat),
                 "apply": results["sndr apply (in-process)"], "verify": results["sndr verify (in-process)"],
                 "revert": results["sndr revert (in-process)"]}
        ok &= stack_rows(pin, work, args, small, n_edits)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def stack_rows(pin: Path, work: Path, args, small: dict[str, float], small_edits: int) -> bool:
    files = pick_stack_files(pin, args.stack_files)
    patches, n_patches, n_edits = build_stack(pin, files, work)
    stack_set = load_patch_set(patches, packs=False)
    counter = iter(range(10**6))

    def fresh() -> Path:
        return copy(pin, files, work / f"s{next(counter)}")

    def patched() -> Path:
        d = fresh()
        r = run_apply(d, stack_set)
        assert r.ok, [p.render() for p in r.problems]
        return d

    big = {"dry-run": timed(lambda d: run_apply(d, stack_set, dry_run=True), fresh, args.stack_repeat),
           "apply": timed(lambda d: run_apply(d, stack_set), fresh, args.stack_repeat),
           "verify": timed(lambda d: run_verify(d, stack_set), patched, args.stack_repeat),
           "revert": timed(lambda d: run_revert(d), patched, args.stack_repeat)}
    d = patched()
    stacked = all(f"# B{i} stacked on A{i}" in (d / rel).read_text() for i, rel in enumerate(files))
    print(f"stack: {n_patches} patches, {n_edits} edits, {len(files)} files (after-ordered, stacked, edge insertions); "
          f"median of {args.stack_repeat}; every stacked edit present: {stacked}")
    worst = 0.0
    for k, t in big.items():
        per, per_small = t / n_edits, small[k] / small_edits
        worst = max(worst, per / per_small)
        print(f"  {k:<8} {t * 1000:8.1f} ms  {per * 1e6:7.1f} us/edit   64-edit set {per_small * 1e6:7.1f} us/edit   "
              f"{per / per_small:5.2f}x per edit")
    print(f"  within 2x of the 64-edit figures per edit: {'met' if worst <= 2.0 else 'MISSED'} (worst {worst:.2f}x)")
    return stacked


if __name__ == "__main__":
    sys.exit(main())
