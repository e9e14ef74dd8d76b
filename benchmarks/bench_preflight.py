"""Bump preflight on a 100-patch set, vLLM 0.32.0 -> 0.33.0, against a naive baseline and the I/O floor.

    python benchmarks/bench_preflight.py [--runs 5] [--naive-sample 3] [--naive-full] [--accuracy]
                                         [--keep DIR] [--json OUT]

The patch set is generated from real code of the two cached trees (seeded, so
every run measures the same set): survivors, regions that moved
(``kv_cache_utils.py`` lost half its code to new modules), regions edited
or deleted upstream, backports whose replacement is the 0.33.0 text (with
merged markers), optional edits, files that are gone, and a runtime patch.
At least 20 edits drift and need suggestions.

Figures (each the best of ``--runs``, fresh objects every run, OS cache warm):

* **floor**: read and sha256 every ``.py`` of the candidate tree;
* **sndr**: load the patch files and run the whole preflight (both plans,
  transitions, relocation suggestions, markers; config drift reported apart),
  as a fresh process would: nothing in memory, the on-disk qualname cache of
  ``sndr.locate`` warm (the state after one earlier preflight or apply);
  ``cold`` is the same with an empty qualname cache (every file parsed);
* **naive**: read and decode the candidate, scan every anchor across every
  file, then ``difflib.get_close_matches`` of each drifted anchor against
  the n-line windows of every file. That last part takes minutes, so it is
  timed on ``--naive-sample`` drifted anchors and extrapolated (``--naive-full``
  runs it all); **naive-same-file** limits difflib to the anchor's own file,
  which is cheap but cannot find code that moved to another file.

``--accuracy`` also derives each drifted anchor's true new place with
``difflib`` (longest run of its lines over its own file and every new file)
and reports top-1 hits of sndr and of the same-file naive matcher.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sndr.load import load_patch_set  # noqa: E402
from sndr.model import Edit, FileEdits, Patch, RuntimeEdit  # noqa: E402
from sndr.preflight.analysis import run_preflight  # noqa: E402
from sndr.tomlwrite import dumps_patch  # noqa: E402
from sndr.tree import open_tree  # noqa: E402
from tests.preflight_oracle import true_location  # noqa: E402

PIN, CANDIDATE = "vllm==0.32.0", "vllm==0.33.0"
KU = "vllm/v1/core/kv_cache_utils.py"
GONE_WITH_HEIRS = ["vllm/entrypoints/launchers/cli_args.py", "vllm/renderers/chat_utils.py",
                   "vllm/entrypoints/generate/structured_decisions/strategies.py",
                   "vllm/models/deepseek_v4/nvidia/ops/prepare_megamoe.py"]


# ============================================================================ the patch set


def _texts(spec: str) -> dict[str, str]:
    tree = open_tree(spec)
    out = {}
    for rel in tree.files():
        data = tree.read_bytes(rel)
        if data is not None:
            try:
                out[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
    return out


def _good_line(s: str) -> bool:
    t = s.strip()
    return bool(t) and not t.startswith(("#", '"', "'", "@")) and t not in (")", "]", "}", "):", "else:", "try:")


def _windows(lines: list[str], rng: random.Random, count: int, used: list[tuple[int, int]],
             starts: list[int] | None = None):
    """Random line windows (2-5 lines of code, one of them distinctive), not overlapping ``used``."""
    starts = list(range(len(lines))) if starts is None else list(starts)
    rng.shuffle(starts)
    for i in starts:
        n = rng.choice((2, 3, 3, 4, 5))
        win = lines[i:i + n]
        if len(win) < n or not all(_good_line(x) for x in win) or max(len(x.strip()) for x in win) < 24:
            continue
        if any(i - 3 < b and a < i + n + 3 for a, b in used):
            continue
        yield i, n
        count -= 1
        if count <= 0:
            return


def _note(anchor: str, name: str) -> str:
    last = [ln for ln in anchor.split("\n") if ln.strip()][-1]
    return anchor + last[: len(last) - len(last.lstrip())] + f"# bench: {name}\n"


def generate_set(pin: dict[str, str], cand: dict[str, str], n_patches: int = 100, seed: int = 7) -> list[Patch]:
    rng = random.Random(seed)
    used: dict[str, list[tuple[int, int]]] = {}
    patches: list[Patch] = []

    changed_lines: dict[str, set[int]] = {}

    def touched(rel: str) -> set[int]:
        """Pin line indices that upstream replaced or deleted (difflib, once per file)."""
        if rel not in changed_lines:
            # Lines the candidate no longer has anywhere in the file (cheap; each cut is verified anyway).
            now = set(cand[rel].split("\n"))
            changed_lines[rel] = {i for i, ln in enumerate(pin[rel].split("\n")) if ln.strip() and ln not in now}
        return changed_lines[rel]

    def take(rel: str, want: str, count: int, required: bool = True) -> list[Edit]:
        """``count`` windows of ``rel`` whose anchor on the candidate is ``want`` (applies/drifted/missing)."""
        text = pin[rel]
        lines = text.split("\n")
        got: list[Edit] = []
        starts = None
        if rel in cand and want == "drifted":
            starts = sorted({j for i in touched(rel) for j in range(i - 4, i + 1) if j >= 0})
        for i, n in _windows(lines, rng, 400, used.setdefault(rel, []), starts):
            anchor = "\n".join(lines[i:i + n]) + "\n"
            if text.count(anchor) != 1:
                continue
            c = cand.get(rel)
            k = c.count(anchor) if c is not None else -1
            kind = "missing" if k < 0 else "applies" if k == 1 else "drifted" if k == 0 else "ambiguous"
            if kind != want:
                continue
            used[rel].append((i, i + n))
            name = f"e{len(patches)}_{len(got)}"
            got.append(Edit(name=name, anchor=anchor, replacement=_note(anchor, name), required=required))
            if len(got) == count:
                break
        return got

    def add(rel: str, edits: list[Edit], title: str, **kw) -> None:
        if edits:
            patches.append(Patch(id=f"PB{len(patches) + 1:03d}", title=title,
                                 files=[FileEdits(path=rel, edits=edits)], **kw))

    changed = sorted((r for r in pin if r in cand and pin[r] != cand[r] and 300 < pin[r].count("\n") < 8000),
                     key=lambda r: -abs(len(cand[r]) - len(pin[r])))
    unchanged = sorted(r for r in pin if cand.get(r) == pin[r] and 400 < pin[r].count("\n") < 4000)
    hot = [r for r in changed if r != KU][:24]
    # -- drifted: moved out of kv_cache_utils.py, and edited or deleted in changed files
    for _ in range(10):
        add(KU, take(KU, "drifted", 1), "moved region")
    for rel in hot[:14]:
        add(rel, take(rel, "drifted", 1), "edited region")
    # -- gone files whose content went elsewhere
    for rel in GONE_WITH_HEIRS:
        if rel in pin:
            add(rel, take(rel, "missing", 1), "file gone")
    # -- backports: the 0.33.0 text of a small upstream hunk, with a merged marker
    backports = 0
    for rel in hot:
        if backports >= 8:
            break
        a, b = pin[rel].split("\n"), cand[rel].split("\n")
        sm = difflib.SequenceMatcher(None, a, b)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag != "replace" or not (1 <= i2 - i1 <= 2 and 1 <= j2 - j1 <= 3) or i1 < 1:
                continue
            anchor = "\n".join(a[i1 - 1:i2 + 1]) + "\n"
            repl = "\n".join(b[j1 - 1:j2 + 1]) + "\n"
            marker = max((x.strip() for x in b[j1:j2]), key=len)
            if (pin[rel].count(anchor) != 1 or len(marker) < 20 or marker in pin[rel]
                    or any(i1 - 4 < e and s < i2 + 4 for s, e in used.setdefault(rel, []))):
                continue
            used[rel].append((i1 - 1, i2 + 1))
            add(rel, [Edit(name=f"bp{backports}", anchor=anchor, replacement=repl, merged_markers=[marker])],
                "backport", upstream=[f"vllm#{95000 + backports}"])
            backports += 1
            break
    # -- optional edits on code edited upstream: soft-skips
    for rel in hot[14:16]:
        add(rel, take(rel, "drifted", 1, required=False), "optional edit")
    # -- a runtime patch checked statically
    patches.append(Patch(id=f"PB{len(patches) + 1:03d}", title="runtime", kind="runtime", runtime=[
        RuntimeEdit(name="hasher", target="vllm.v1.core.kv_cache_utils:get_request_block_hasher",
                    replacement="sndr.kernels.bench:hasher")]))
    # -- survivors fill the rest: one or two edits each, in changed and unchanged files
    pool = [*hot, *unchanged[:12], KU]
    for k in range(20 * n_patches):
        if len(patches) >= n_patches:
            break
        rel = pool[k % len(pool)]
        add(rel, take(rel, "applies", rng.choice((1, 1, 2))), "survivor")
    return patches


def write_set(patches: list[Patch], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for p in patches:
        (dest / f"{p.id}.toml").write_text(dumps_patch(p), encoding="utf-8")


# ============================================================================ the measured things


def floor(spec: str) -> float:
    t0 = time.perf_counter()
    tree = open_tree(spec)
    for _rel, data in tree._iter_contents():
        hashlib.sha256(data).digest()
    return time.perf_counter() - t0


def run_sndr(patch_dir: Path, cold_dir: Path | None = None, config: bool = False):
    """One preflight as a fresh process would run it: no in-memory qualname cache.

    ``cold_dir``: point the on-disk qualname cache at this (empty) directory,
    so every file is parsed again.
    """
    from sndr import locate

    locate._scopes_cached.cache_clear()
    saved = locate._disk_cache
    if cold_dir is not None:
        cold_dir.mkdir(parents=True, exist_ok=True)
        locate._disk_cache = lambda: cold_dir
    try:
        t0 = time.perf_counter()
        ps = load_patch_set(patch_dir, packs=False)
        report = run_preflight(ps, PIN, CANDIDATE, config=config)
        return time.perf_counter() - t0, report
    finally:
        locate._disk_cache = saved


def _stripped(text: str) -> str:
    return "\n".join(x.strip() for x in text.rstrip("\n").split("\n"))


def _windows_of(text: str, n: int) -> list[str]:
    lines = [x.strip() for x in text.split("\n")]
    return ["\n".join(lines[i:i + n]) for i in range(max(1, len(lines) - n + 1))]


def naive(patch_dir: Path, sample: int | None, same_file_only: bool = False, file_share: float = 1.0):
    """(seconds, per-drifted-anchor difflib seconds, number of drifted, {edit: top-1 (file, line)}).

    ``file_share`` < 1 (the every-file variant only) times difflib on every k-th file and scales the
    per-anchor cost by the windows it skipped: the full scan costs minutes per anchor.
    """
    t0 = time.perf_counter()
    ps = load_patch_set(patch_dir, packs=False)
    texts = {}
    tree = open_tree(CANDIDATE)
    for rel, data in tree._iter_contents():
        texts[rel] = data.decode("utf-8", "replace")
    drifted = []
    for p in ps.patches:
        for f, e in p.edits():
            hits = {rel: t.count(e.anchor) for rel, t in texts.items() if e.anchor in t}  # every file
            own = texts.get(f.path)
            markers = [*p.merged_markers, *f.merged_markers, *e.merged_markers]
            if own is not None and any(m in own for m in markers):
                continue  # merged
            if hits.get(f.path, 0) == 0:
                drifted.append((f.path, e))
    t_scan = time.perf_counter() - t0
    todo = drifted if sample is None else drifted[:sample]
    tops = {}
    every = sorted(texts)
    step = max(1, round(1 / file_share)) if not same_file_only else 1
    scale = sum(t.count("\n") for t in texts.values()) / max(1, sum(texts[r].count("\n") for r in every[::step]))
    t1 = time.perf_counter()
    for path, e in todo:
        n = len(e.anchor.rstrip("\n").split("\n"))
        want = _stripped(e.anchor)
        best = []
        scope = [path] if same_file_only else every[::step]
        for rel in scope:
            if rel not in texts:
                continue
            wins = _windows_of(texts[rel], n)
            for m in difflib.get_close_matches(want, wins, n=3, cutoff=0.5):
                best.append((difflib.SequenceMatcher(None, want, m).ratio(), rel, wins.index(m) + 1))
        best.sort(reverse=True)
        if best:
            tops[e.name] = (best[0][1], best[0][2])
    per = (time.perf_counter() - t1) / max(1, len(todo)) * (scale if step > 1 else 1.0)
    total = t_scan + per * len(drifted)
    return total, t_scan, per, len(drifted), tops


def _cached_releases() -> list[str]:
    from sndr import env

    trees = env.cache_root() / "trees"
    return [p.name[len("vllm-"):] for p in trees.glob("vllm-*")] if trees.is_dir() else []


def big_stack(runs: int, json_out: str | None) -> int:
    """Big stack, long jump: >= 250 patches from real 0.24.0 code, >= 200 drifted or missing on 0.32.0."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from preflight_stack import generate, texts, write

    from sndr import caches
    from sndr.preflight.hops import auto_releases

    caches.enable()
    pin_v, cand_v = "0.24.0", "0.32.0"
    patches = generate(texts(pin_v), texts(cand_v), 260, 11, pin_version=pin_v)
    d = Path(tempfile.mkdtemp(prefix="sndr-big-")) / "stack"
    write(patches, d)
    via = auto_releases(pin_v, cand_v, published=_cached_releases())
    res = {}

    def once(mode: str, suggestions: bool = True):
        from sndr import locate
        from sndr.preflight import hops

        locate._scopes_cached.cache_clear()  # as a fresh process: only the on-disk caches are warm
        hops._STATES.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        ps = load_patch_set(d, packs=False)
        report = run_preflight(ps, f"vllm=={pin_v}", f"vllm=={cand_v}", config=False, suggestions=suggestions,
                               via=via if mode == "via" else None)
        return time.perf_counter() - t0, time.process_time() - c0, report

    # Wall time is what a user waits; CPU time (this process) is what the code costs when the machine is
    # shared (on a loaded 2-core box the wall clock can be several times the CPU time).
    for mode in ("direct", "via"):
        once(mode)  # warm-up: OS cache, per-tree line indexes and scopes on disk
        samples = [once(mode) for _ in range(max(1, runs))]  # (wall, CPU, report) per run
        walls, cpus, report = [s[0] for s in samples], [s[1] for s in samples], samples[-1][2]
        n_sug = sum(1 for p in report.patches for e in p.edits if e.confidence is not None)
        res[mode] = {"seconds": min(walls), "cpu_seconds": min(cpus), "suggested_edits": n_sug,
                     "confidence": report.summary.confidence}
        print(f"big stack {mode:6s} {len(patches)} patches, {report.summary.edits} edits, {n_sug} drifted or "
              f"missing: {min(walls):7.2f} s wall, {min(cpus):6.2f} s CPU, warm (best of {len(walls)}); "
              f"confidence {report.summary.confidence}" + (f"; via {', '.join(via)}" if mode == "via" else ""),
              flush=True)
    bare = [once("direct", suggestions=False)[:2] for _ in range(max(1, runs))]
    bare_wall, bare_cpu = min(b[0] for b in bare), min(b[1] for b in bare)
    n = res["direct"]["suggested_edits"]
    per_wall = (res["direct"]["seconds"] - bare_wall) / max(1, n)
    per_cpu = (res["direct"]["cpu_seconds"] - bare_cpu) / max(1, n)
    res["direct"].update(without_suggestions_s=bare_wall, without_suggestions_cpu_s=bare_cpu,
                         per_suggestion_ms=per_wall * 1e3, per_suggestion_cpu_ms=per_cpu * 1e3)
    print(f"big stack direct without suggestions: {bare_wall:7.2f} s wall, {bare_cpu:6.2f} s CPU -> "
          f"{per_wall * 1e3:.1f} ms wall, {per_cpu * 1e3:.1f} ms CPU per suggestion ({n} suggestions)", flush=True)
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--naive-sample", type=int, default=3, help="drifted anchors timed for the full naive difflib")
    ap.add_argument("--naive-full", action="store_true", help="run the naive difflib on every drifted anchor")
    ap.add_argument("--naive-files", type=float, default=0.05,
                    help="share of the files the sampled naive difflib runs on (extrapolated by line count)")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="write the generated patch set here (kept)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--big", action="store_true",
                    help="the big stack, long jump case instead: 260 patches cut from 0.24.0, bumped to 0.32.0, "
                         "direct and --via auto")
    args = ap.parse_args(argv)
    if args.big:
        return big_stack(args.runs, args.json)

    from sndr import caches

    caches.enable()  # the on-disk qualname cache, as the CLI uses it
    pin, cand = _texts(PIN), _texts(CANDIDATE)
    patches = generate_set(pin, cand)
    tmp = Path(tempfile.mkdtemp(prefix="sndr-bench-"))
    patch_dir = Path(args.keep) if args.keep else tmp / "patches"
    write_set(patches, patch_dir)
    n_edits = sum(len(list(p.edits())) + len(p.runtime) for p in patches)

    # Warm-up: OS cache, the qualname cache on disk, imports.
    floor(CANDIDATE)
    _, report = run_sndr(patch_dir)
    s = report.summary
    drifted = [e for p in report.patches for e in p.edits if e.verdict.value in ("drifted", "file_missing")
               or (e.verdict_if_enabled and e.verdict_if_enabled.value in ("drifted", "file_missing"))]
    print(f"set: {len(patches)} patches, {n_edits} edits, {len(pin)} -> {len(cand)} files")
    print(f"verdicts on the candidate: {s.counts}")
    print(f"drifted or file_missing edits: {len(drifted)} ({s.suggestion_hits} with suggestions)")

    t_floor = min(floor(CANDIDATE) for _ in range(args.runs))
    t_warm = min(run_sndr(patch_dir)[0] for _ in range(args.runs))
    colds = []
    for k in range(max(1, args.runs // 2)):
        colds.append(run_sndr(patch_dir, cold_dir=tmp / f"cold{k}")[0])
    t_cold = min(colds)
    t_config = min(run_sndr(patch_dir, config=True)[0] for _ in range(max(1, args.runs // 2)))
    nb_total, nb_scan, nb_per, nb_n, _ = naive(patch_dir, None if args.naive_full else args.naive_sample,
                                               file_share=1.0 if args.naive_full else args.naive_files)
    ns_total, _, ns_per, _, ns_tops = naive(patch_dir, None, same_file_only=True)

    res = {
        "patches": len(patches), "edits": n_edits, "drifted_needing_suggestions": len(drifted),
        "floor_s": t_floor, "sndr_warm_s": t_warm, "sndr_cold_s": t_cold, "sndr_with_config_s": t_config,
        "naive_s": nb_total, "naive_scan_s": nb_scan, "naive_difflib_per_anchor_s": nb_per,
        "naive_extrapolated": not args.naive_full, "naive_same_file_s": ns_total,
        "speedup_vs_naive": nb_total / t_warm, "speedup_vs_naive_same_file": ns_total / t_warm,
        "sndr_over_floor": t_warm / t_floor,
    }
    print(f"\nread-and-hash floor (candidate)   {t_floor:7.3f} s")
    print(f"sndr preflight, warm               {t_warm:7.3f} s   ({t_warm / t_floor:.1f}x the floor)")
    print(f"sndr preflight, cold qualnames     {t_cold:7.3f} s")
    print(f"sndr preflight + config drift      {t_config:7.3f} s")
    how = ("measured" if args.naive_full else f"scan measured + difflib {nb_per:.2f} s/anchor x {nb_n} (timed on "
           f"{args.naive_sample} anchors x {args.naive_files:.0%} of the files, extrapolated)")
    print(f"naive (every file)                 {nb_total:7.3f} s   ({how})")
    print(f"naive (difflib on own file only)   {ns_total:7.3f} s")
    print(f"speedup vs naive                   {res['speedup_vs_naive']:7.1f}x")
    print(f"speedup vs naive same-file         {res['speedup_vs_naive_same_file']:7.1f}x")

    if args.accuracy:
        hit = hit_naive = total = 0
        for p in report.patches:
            for e in p.edits:
                if e.kind != "text" or not (e.verdict.value in ("drifted", "file_missing") or e.verdict_if_enabled):
                    continue
                edit = next(x for f, x in next(q for q in patches if q.id == p.id).edits() if x.name == e.name)
                t = true_location(edit.anchor, e.file, pin, cand)
                if t is None:
                    continue  # deleted upstream: no true place
                total += 1
                rel, lo, hi = t
                if e.suggestions and e.suggestions[0].file == rel and e.suggestions[0].line <= hi and lo <= e.suggestions[0].end_line:
                    hit += 1
                nt = ns_tops.get(e.name)
                n = len(edit.anchor.rstrip("\n").split("\n"))
                if nt and nt[0] == rel and nt[1] <= hi and lo <= nt[1] + n - 1:
                    hit_naive += 1
        res.update(accuracy_total=total, accuracy_sndr_top1=hit, accuracy_naive_same_file_top1=hit_naive)
        print(f"top-1 suggestion hits (oracle: difflib)   sndr {hit}/{total}   naive same-file {hit_naive}/{total}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
