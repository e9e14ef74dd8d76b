#!/usr/bin/env python3
"""The plugins' first-use canary: its cost, cold and warm (issue 28: <= 50 ms cold, <= 1 ms warm).

    python3 benchmarks/bench_canary.py [--rep 20] [--json OUT.json]

* cold: a process's first use with an empty pass cache: identity (GPU name,
  driver, CUDA), the kernel source hash, the fixed problem (pack on the CPU,
  float64 reference), the kernel on the device, the comparison, the sealed
  cache write. The kernel's own build (NVRTC, at its first call anyway, canary
  or not) is done before timing and reported apart.
* warm: a new process (in-process verdicts dropped) whose pass cache holds the
  entry: identity, hash, the owner-checked walk to ``<cache>/canary``, the
  HMAC check of one entry.
* hot: later calls of the same shape in the same process (one dict lookup).

On a CUDA GPU (sm_90 by default scope; sm_89+ with SNDR_ENABLE_PK0001=1) the
kernel is PK0001's CUDA decode for head dim 128, Hq/Hk 32/8, page 16, bf16; and
PK0002's verify kernel (K = 3). Without one, the CPU stand-in kernel is the
float64 reference itself (the problem, the reference and the cache are what
is timed; the line says so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sndr.kernels import canary as generic  # noqa: E402
from sndr.kernels.turboquant_k8v4 import canary, reference  # noqa: E402

HQ, HK, D, PAGE, K = 32, 8, 128, 16, 3


def _fresh_process(drop_identity: bool) -> None:
    generic.reset()
    canary._OK.clear()
    if drop_identity:
        generic._PACKAGE_HASH.clear()
        generic._IDENT.clear()


def _ms(f) -> float:
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    os.environ["SNDR_ENABLE_PK0001"] = os.environ.get("SNDR_ENABLE_PK0001", "1")
    out: dict = {"rep": args.rep}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SNDR_CACHE_DIR"] = tmp
        if gpu:
            from sndr.kernels.turboquant_k8v4 import mtp_verify

            dev = torch.device("cuda", 0)
            q = torch.empty(1, HQ, D, dtype=torch.bfloat16, device=dev)
            kv = torch.empty(1, PAGE, HK, reference.Layout(D).slot_size_aligned, dtype=torch.uint8, device=dev)
            t0 = time.perf_counter()  # the builds the first call makes anyway
            canary.decode_check(lambda *a: _decode(*a), HQ, HK, D, PAGE, torch.bfloat16, dev)
            mtp_verify.prepare(0, torch.bfloat16, HQ, HK, D, PAGE, K)
            torch.cuda.synchronize()
            out["build_ms"] = (time.perf_counter() - t0) * 1000
            out["device"] = generic.identity(0)[1]
            runs = {"PK0001": lambda: canary.decode_ok(q, kv, "cuda"),
                    "PK0002": lambda: canary.verify_ok(0, torch.bfloat16, HQ, HK, D, PAGE, K)}
        else:
            out["device"] = f"CPU (no CUDA): the stand-in kernel is the float64 reference, torch {torch.__version__}"
            ident = {"gpu": "cpu", "driver": "-", "cuda": "-"}

            def cpu_run():
                return generic.check("PK0001", "cpu stand-in", device="cpu", identity=ident,
                                     kernel_hash=canary.kernel_hash(),
                                     run=lambda: canary.decode_check(
                                         lambda q, kv, bt, sl, s: reference.decode(q, kv, bt, sl, s),
                                         HQ, HK, D, PAGE, torch.bfloat16))
            runs = {"PK0001": cpu_run}
        for plugin, run in runs.items():
            cold, warm, hot = [], [], []
            for _ in range(args.rep):
                for p in Path(tmp, "canary").glob("*.json"):
                    p.unlink()
                _fresh_process(True)
                cold.append(_ms(run))
                _fresh_process(True)
                warm.append(_ms(run))
                hot.append(_ms(run))
            verdicts = generic.results()
            out[plugin] = {"cold_ms": statistics.median(cold), "warm_ms": statistics.median(warm),
                           "hot_us": statistics.median(hot) * 1000, "cold_max_ms": max(cold),
                           "warm_max_ms": max(warm), "verdicts": verdicts}
            r = out[plugin]
            print(f"{plugin}: cold {r['cold_ms']:.1f} ms (max {r['cold_max_ms']:.1f}; budget 50: "
                  f"{'ok' if r['cold_ms'] <= 50 else 'MISS'}), warm {r['warm_ms']:.3f} ms (max "
                  f"{r['warm_max_ms']:.3f}; budget 1: {'ok' if r['warm_ms'] <= 1 else 'MISS'}), "
                  f"hot {r['hot_us']:.1f} us; {verdicts[-1]['status'] if verdicts else '?'}")
    print("device:", out["device"])
    if "build_ms" in out:
        print(f"kernel builds before timing (made at first use anyway): {out['build_ms']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


def _decode(q, kv, bt, sl, scale):
    from sndr.kernels.turboquant_k8v4 import dispatch

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return dispatch._try_cuda(q, kv, bt, sl, scale, out, None, None, 32)


if __name__ == "__main__":
    sys.exit(main())
