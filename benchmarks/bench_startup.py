"""Startup cost of sndr on the real vLLM 0.32.0 CPU install.

Measures, each in fresh interpreters (medians over ``--repeat`` interleaved runs):

* ``register()`` on a tree patched on disk: cold (empty cache: the patch set
  is loaded with pydantic and memoised) and warm (the memo) -- target < 20 ms;
* import time of ``vllm.v1.core.sched.scheduler`` and
  ``vllm.v1.worker.gpu_model_runner``:
  - *plain*: the same patched files on disk, loaded from warm ``.pyc``;
  - *hook cold*: pristine tree + the ``.pth``, empty cache (plans, compiles);
  - *hook warm*: the same with the cache filled -- target within 1.10x of plain;
* inside those imports, the time to obtain the patched modules' code objects
  (``.pyc`` read vs. hook cache read + verification) and the hook's
  activation (fingerprint, hashing the files the plan read, memo lookup);
* the CLI (``--section cli`` runs only this): the CPU time (user + system, of the
  child process) of ``python -m sndr COMMAND --help`` for every command of
  :data:`sndr.commands.COMMANDS`, over a bare ``python -c pass`` -- target <= 60 ms,
  and no pydantic imported; and of a warm ``python -m sndr apply --verify`` on the
  tree patched on disk, with ``--tree`` and without (the installed vLLM, as the deploy
  recipe calls it) -- target <= 150 ms each (medians of ``--cli-repeat``).

Usage::

    python benchmarks/bench_startup.py [--python ~/.cache/sndr/vllm-0.32.0-venv/bin/python] [--repeat 3] [--json out.json]
    python benchmarks/bench_startup.py --section cli    # the CLI figures only

The patch set is ``tests/data/hook`` (two text patches on the two modules, one
runtime patch on the scheduler) unless ``--patches`` names another directory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO))

import vllm_env  # noqa: E402

MODULES = ["vllm.v1.core.sched.scheduler", "vllm.v1.worker.gpu_model_runner"]

REGISTER = r"""
import json, os, time
import vllm.plugins  # vLLM itself is loaded before the plugins run: not our cost
if os.environ.get("BENCH_PRELOAD_PROMETHEUS"):
    import prometheus_client  # an API server has it loaded before plugins run: not our cost
t0 = time.perf_counter()
import sndr.startup.hook
t1 = time.perf_counter()
sndr.startup.hook.register()
t2 = time.perf_counter()
import sys
print("OUT" + json.dumps({"import_ms": (t1 - t0) * 1e3, "register_ms": (t2 - t1) * 1e3,
                          "total_ms": (t2 - t0) * 1e3, "mode": sndr.startup.hook._STATE.mode,
                          "missing": sndr.startup.hook._STATE.missing, "pydantic": "pydantic.main" in sys.modules}))
"""

IMPORT = r"""
import json, time, importlib, importlib.machinery
TARGETS = {"vllm/v1/core/sched/scheduler.py", "vllm/v1/worker/gpu_model_runner.py"}
code_ms = [0.0]
def _timed(fn):
    def wrapper(self, *a, **k):
        path = self.get_filename(*a[:1]) if hasattr(self, "get_filename") else ""
        hit = any(str(path).endswith(t) for t in TARGETS)
        t = time.perf_counter()
        try:
            return fn(self, *a, **k)
        finally:
            if hit:
                code_ms[0] += (time.perf_counter() - t) * 1e3
    return wrapper
importlib.machinery.SourceFileLoader.get_code = _timed(importlib.machinery.SourceFileLoader.get_code)
act_ms = [0.0]
try:
    from sndr.startup import importer
    # get_code fetches (and verifies) the cached source itself: timing it alone avoids double counting.
    importer.PatchedLoader.get_code = _timed(importer.PatchedLoader.get_code)
    _act = importer.SndrFinder._activate
    def _activate(self, spec):
        t = time.perf_counter()
        try:
            return _act(self, spec)
        finally:
            act_ms[0] += (time.perf_counter() - t) * 1e3
    importer.SndrFinder._activate = _activate
except ImportError:
    pass
t0 = time.perf_counter()
m = importlib.import_module(MODULE)
t1 = time.perf_counter()
print("OUT" + json.dumps({"import_s": t1 - t0, "code_ms": code_ms[0], "activate_ms": act_ms[0],
                          "loader": type(m.__spec__.loader).__name__}))
"""


def _out(proc) -> dict:
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT")][-1]
    return json.loads(line[3:])


def _med(values):
    return statistics.median(values) if values else float("nan")


def _cpu_ms(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    """(CPU ms of the child: user + system, the process's own cost, not the machine's load), the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3, proc


def _cli(args, disk, results: dict) -> bool:
    """``--help`` of every command against a bare interpreter, and a warm ``apply --verify`` with and without
    ``--tree``, in CPU ms (medians); True when every target is met."""
    from sndr.commands import COMMANDS

    n = args.cli_repeat
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SNDR_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)
    bare = _med([_cpu_ms([sys.executable, "-c", "pass"], env=env)[0] for _ in range(n)])
    fig: dict = {"bare_python_ms": bare, "help": {}}
    print(f"CLI (CPU ms, median of {n}; bare python -c pass: {bare:.1f} ms):", flush=True)
    ok = True
    for name in COMMANDS:
        argv = [sys.executable, "-m", "sndr", name, "--help"]
        cpu = _med([_cpu_ms(argv, env=env, cwd=str(REPO))[0] for _ in range(n)])
        _, proc = _cpu_ms([sys.executable, "-X", "importtime", *argv[1:]], env=env, cwd=str(REPO))
        mods = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
        heavy = sorted(mods & {"pydantic", "sndr.model", "rich", "packaging"})
        fig["help"][name] = {"cpu_ms": cpu, "over_bare_ms": cpu - bare, "modules": len(mods), "heavy": heavy}
        met = cpu - bare <= 60 and not heavy and proc.returncode == 0
        ok &= met
        print(f"  {name + ' --help':<26} {cpu:6.1f} ms (+{cpu - bare:5.1f} over bare; {len(mods)} modules"
              f"{'; imports ' + ', '.join(heavy) if heavy else ''}){'' if met else '  MISSED (target +60 ms)'}",
              flush=True)
    # apply --verify on the tree patched on disk, as the deploy recipe runs it (cwd /, its own interpreter)
    venv = disk.environ()
    for label, extra in (("with --tree", ["--tree", str(disk.site)]), ("without --tree", [])):
        argv = [disk.python, "-m", "sndr", "apply", "--verify", *extra]
        for _ in range(2):  # cold, then primed: the memos the warm path reads
            first = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=venv, timeout=600)
            assert first.returncode == 0, first.stdout + first.stderr
        runs = [_cpu_ms(argv, cwd="/", env=venv) for _ in range(n)]
        assert all(p.returncode == 0 for _, p in runs), runs[-1][1].stderr
        cpu = _med([c for c, _ in runs])
        _, proc = _cpu_ms([disk.python, "-X", "importtime", *argv[1:]], cwd="/", env=venv)
        mods = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
        warm = "pydantic" not in mods and "sndr.model" not in mods
        fig["verify " + label] = {"cpu_ms": cpu, "warm_path": warm}
        met = cpu <= 150 and warm
        ok &= met
        print(f"  apply --verify {label:<15} {cpu:6.1f} ms ({'warm path' if warm else 'FULL VERIFIER (pydantic)'})"
              f"{'' if met else '  MISSED (target 150 ms)'}", flush=True)
    results["cli"] = fig
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=vllm_env.vllm_python(), help="python of the real vLLM install")
    ap.add_argument("--patches", type=Path, default=REPO / "tests" / "data" / "hook")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--register-repeat", type=int, default=7)
    ap.add_argument("--workdir", type=Path, help="keep the environments here (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, help="write the figures as JSON")
    ap.add_argument("--section", choices=("all", "cli"), default="all", help="cli: only the CLI figures")
    ap.add_argument("--cli-repeat", type=int, default=7, help="runs per CLI figure (the median is reported)")
    args = ap.parse_args(argv)
    if not args.python:
        print(vllm_env.skip_reason(), file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="sndr-bench-"))
    try:
        return _run(args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, work: Path) -> int:
    from sndr.__main__ import main as sndr_main
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    install = vllm_env.probe(args.python)
    print(f"vLLM install: {install.vllm_dir} (python {install.pyver}); work dir {work}", flush=True)
    master = vllm_env.build_master(install, work / "master")
    disk = vllm_env.make_env(install, master, work / "disk")
    mem = vllm_env.make_env(install, master, work / "mem")
    report = run_apply(disk.site, load_patch_set(args.patches, packs=False), environ={})
    assert report.ok, report.model_dump_json(indent=1)
    assert sndr_main(["hook", "install", "--site", str(mem.site)]) == 0
    common = {"SNDR_PATCHES": str(args.patches), "SNDR_RUN_DIR": str(work / "run")}
    disk.extra_env.update(common, SNDR_CACHE_DIR=str(work / "cache-disk"))
    mem.extra_env.update(common, SNDR_CACHE_DIR=str(work / "cache-mem"))
    results: dict = {"patches": str(args.patches), "repeat": args.repeat}
    if args.section == "cli":
        ok = _cli(args, disk, results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        print("targets met" if ok else "TARGETS MISSED")
        return 0 if ok else 1

    # -- register() ------------------------------------------------------------
    cold = _out(disk.run(REGISTER))
    warm = [_out(disk.run(REGISTER)) for _ in range(args.register_repeat)]
    assert cold["mode"] == "disk" and not cold["missing"], cold
    results["register"] = {"cold_ms": cold["total_ms"], "warm_ms": _med([w["total_ms"] for w in warm]),
                           "warm_min_ms": min(w["total_ms"] for w in warm),
                           "warm_import_ms": _med([w["import_ms"] for w in warm]),
                           "warm_register_ms": _med([w["register_ms"] for w in warm]),
                           "warm_loads_pydantic": any(w["pydantic"] for w in warm)}
    r = results["register"]
    print(f"register() on a patched tree: cold {r['cold_ms']:.1f} ms, warm median {r['warm_ms']:.1f} ms "
          f"(min {r['warm_min_ms']:.1f}) "
          f"(import {r['warm_import_ms']:.1f} + call {r['warm_register_ms']:.1f}; target < 20 ms)", flush=True)

    # -- register() publishing metrics (issue 22) -------------------------------------
    # Same warm register(), with the gauges published: sndr imports prometheus_client
    # itself (PROMETHEUS_MULTIPROC_DIR set), or finds it already loaded (API server).
    for label, extra in (("metrics_import", {}), ("metrics_preloaded", {"BENCH_PRELOAD_PROMETHEUS": "1"})):
        prom = work / f"prom-{label}"
        prom.mkdir(exist_ok=True)
        runs = [_out(disk.run(REGISTER, PROMETHEUS_MULTIPROC_DIR=str(prom), **extra))
                for _ in range(args.register_repeat)]
        r[label + "_ms"] = _med([w["total_ms"] for w in runs])
    print(f"register() publishing metrics: {r['metrics_import_ms']:.1f} ms when it imports prometheus_client, "
          f"{r['metrics_preloaded_ms']:.1f} ms when vLLM already loaded it (no metrics: {r['warm_ms']:.1f} ms)",
          flush=True)

    # -- imports -----------------------------------------------------------------
    for module in MODULES:
        code = IMPORT.replace("MODULE", repr(module))
        disk.run(code)  # warm the .pyc of the patched files and the OS cache
        mem.run(code)  # fill the hook's cache
        rows = {"plain": [], "hook_cold": [], "hook_warm": []}
        for i in range(args.repeat):
            rows["plain"].append(_out(disk.run(code)))
            cold_cache = work / f"cache-cold-{module}-{i}"
            rows["hook_cold"].append(_out(mem.run(code, SNDR_CACHE_DIR=str(cold_cache))))
            rows["hook_warm"].append(_out(mem.run(code)))
        assert all(o["loader"] == "SourceFileLoader" for o in rows["plain"])
        assert all(o["loader"] == "PatchedLoader" for o in rows["hook_cold"] + rows["hook_warm"])
        fig = {k: {"import_s": _med([o["import_s"] for o in v]), "code_ms": _med([o["code_ms"] for o in v]),
                   "activate_ms": _med([o["activate_ms"] for o in v])} for k, v in rows.items()}
        plain = fig["plain"]["import_s"]
        fig["ratio_cold"] = fig["hook_cold"]["import_s"] / plain
        fig["ratio_warm"] = fig["hook_warm"]["import_s"] / plain
        results[module] = fig
        print(f"import {module}:")
        for k in ("plain", "hook_cold", "hook_warm"):
            f = fig[k]
            extra = f", hook activation {f['activate_ms']:.1f} ms" if k != "plain" else ""
            print(f"  {k:<10} {f['import_s']:7.2f} s   (patched module code objects {f['code_ms']:6.1f} ms{extra})")
        print(f"  ratio cold/plain {fig['ratio_cold']:.3f}, warm/plain {fig['ratio_warm']:.3f} "
              f"(target warm <= 1.10)", flush=True)
    ok = results["register"]["warm_ms"] < 20 and all(results[m]["ratio_warm"] <= 1.10 for m in MODULES)
    ok = _cli(args, disk, results) and ok
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
