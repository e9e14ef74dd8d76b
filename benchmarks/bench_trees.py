"""Tree and manifest benchmarks on real vLLM releases (not a test: nothing is asserted).

Each figure is printed next to the baseline it is judged against, measured in
the same run on the same warm page cache, so the ratios survive a slow or busy
machine:

* digest of the 0.33.0 tree vs a plain read-and-hash loop (the floor); target <= 1.5x;
* reading the tree from the wheel (zip, in place) vs from a directory;
* building the manifest for the pin vs digesting the pin.

Run: ``python3 benchmarks/bench_trees.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sndr.env import cache_root  # noqa: E402
from sndr.tree import DirTree, WheelTree, fetch_version  # noqa: E402

CANDIDATE, PIN = "0.33.0", "0.32.0"


def timed(fn, repeat: int) -> tuple[float, float]:
    """(best, median) seconds over ``repeat`` runs, after one warm-up run."""
    fn()
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return min(runs), statistics.median(runs)


def floor_loop(root: Path, rels: list[str]):
    """The physical floor: read and hash each file of a list known in advance.

    Paths are joined up front, so the floor pays for nothing but I/O and hashing.
    """
    paths = [str(root / rel) for rel in rels]

    def run():
        outer = hashlib.sha256()
        for path in paths:
            with open(path, "rb") as fh:
                outer.update(hashlib.sha256(fh.read()).digest())
        return outer.hexdigest()

    return run


def wheel_of(version: str) -> Path | None:
    return next(iter(sorted((cache_root() / "wheels").glob(f"vllm-{version}-*.whl"))), None)


def patch_dir_for_bench() -> tuple[Path, str]:
    """The shipped patch set, or the manifest tests' real-anchor patches while patches/ is empty."""
    from sndr.load import patch_files, shipped_patches_dir

    shipped = shipped_patches_dir()
    if shipped.is_dir() and patch_files(shipped):
        return shipped, f"shipped set ({len(patch_files(shipped))} files)"
    from tests.test_manifest import PATCHES

    tmp = Path(tempfile.mkdtemp(prefix="sndr-bench-patches-"))
    for name, text in PATCHES.items():
        (tmp / name).write_text(text.lstrip())
    return tmp, f"tests/test_manifest.py set ({len(PATCHES)} patches; patches/ is empty)"


def row(label: str, best: float, median: float, base: float | None = None, base_name: str = "") -> None:
    ratio = f"  {best / base:5.2f}x {base_name}" if base else ""
    print(f"  {label:<38} best {best * 1000:8.1f} ms  median {median * 1000:8.1f} ms{ratio}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    root = fetch_version(CANDIDATE)
    rels = DirTree(root).files()
    size = sum((root / r).stat().st_size for r in rels)
    print(f"vllm {CANDIDATE}: {len(rels)} files, {size / 1e6:.1f} MB ({root})")

    floor = timed(floor_loop(root, rels), args.repeat)
    digest = timed(lambda: DirTree(root).digest, args.repeat)
    row("floor: read-and-hash loop", *floor)
    row("DirTree.digest (listing included)", *digest, floor[0], "of floor (target <= 1.50x)")

    wheel = wheel_of(CANDIDATE)
    if wheel is not None:
        def wheel_read():
            with WheelTree(wheel) as w:
                return w.digest

        wheel_t = timed(wheel_read, args.repeat)
        row("WheelTree.digest (open + read zip)", *wheel_t, digest[0], "of DirTree.digest")
    else:
        print("  wheel: no cached wheel, skipped")

    try:
        from sndr.load import load_patch_set
        from sndr.manifest import build_manifest
    except ImportError as exc:
        print(f"  manifest: not available ({exc})")
        return 0
    pin_root = fetch_version(PIN)
    patches, what = patch_dir_for_bench()
    patch_set = load_patch_set(patches)
    pin_digest = timed(lambda: DirTree(pin_root).digest, args.repeat)
    build = timed(lambda: build_manifest(DirTree(pin_root), patch_set), args.repeat)
    print(f"vllm {PIN} manifest, patches: {what}")
    row("DirTree.digest of the pin", *pin_digest)
    row("build_manifest (digest + plan)", *build, pin_digest[0], "of pin digest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
