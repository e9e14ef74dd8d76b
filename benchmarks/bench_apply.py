"""Apply / verify / revert benchmark on real vLLM 0.32.0 files, against git apply and GNU patch.

    python benchmarks/bench_apply.py [--files 16] [--per-file 4] [--repeat 7]

Builds a patch set of files*per-file edits (a comment inserted after unique
def/class lines) over real files of the 0.32.0 tree, expresses the same change
as one unified diff, and times on fresh copies, in one run:

- sndr apply in-process (run_apply: plan + journal + fsync + ledger) and as a
  CLI process (python -m sndr.apply), against `git apply` and GNU `patch -p1`;
- sndr verify (ledger hash check) in-process and as a CLI process;
- sndr revert in-process.

Ratios are printed against the named baselines measured in the same run; on
this shared 2-core machine absolute times mean little.
"""

from __future__ import annotations

import argparse
import difflib
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


def copy(pin: Path, files: list[str], dst: Path) -> Path:
    for rel in files + ["vllm/__init__.py", "vllm/version.py", "vllm/_version.py"]:
        d = dst / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pin / rel, d)
    for info in pin.glob("*.dist-info"):
        shutil.copytree(info, dst / info.name)
    return dst


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
    shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
