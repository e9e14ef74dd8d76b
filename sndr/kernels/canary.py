"""The canary: each plugin's first-use self-check on the real GPU.

At first use in a process, before vLLM captures its CUDA graphs, a plugin runs
a small fixed problem through its kernel and through a float64 reference, and
compares (:func:`check`). The verdict, per process and plugin:

* ``canary_passed``: the kernel's result is within the plugin's tolerance of
  the reference (or a pass is cached for exactly this GPU, driver, CUDA
  runtime, kernel source and problem; see below);
* ``canary_failed``: a mismatch, a NaN, or an exception from the build or the
  launch. The plugin falls back to vLLM's own path for the rest of the process;
* ``canary_skipped``: the plugin does not cover the device or the call (not
  CUDA, too old a GPU, the first call inside a CUDA-graph capture, ...), with why.
  Its dispatch already sends such calls to vLLM's path.

Every verdict other than a pass is visible: one stderr line naming the plugin,
the device and the error (:func:`sndr.startup.common.log`); the process's
attestation (``canary`` in the record, shown by ``python -m sndr status``);
the gauges ``sndr_plugin_canary_failed`` / ``sndr_plugin_canary_skipped``
(:mod:`sndr.startup.metrics`). Under ``SNDR_STRICT=1`` a ``canary_failed``
raises :class:`sndr.startup.runtime.StrictError`: the vLLM worker refuses to
start instead of serving on a fallback. (A skip is not an error: it is the
plugin's documented coverage.)

**The pass cache** lives in ``<cache root>/canary`` under the hook cache's
trust rules (:class:`sndr.fsio.PrivateDir`: walked from ``/`` without
following symlinks, every directory owned by root or this uid and not writable
by others; every entry sealed with an HMAC under the directory's own 0600
secret over its name and bytes). An entry's name is the sha256 of everything
the verdict depends on (plugin, problem, GPU name, driver, CUDA runtime,
kernel source hash, extra versions), and its payload repeats them: an entry
for another kernel hash, another GPU or another driver is never taken for this
one, and a forged or moved entry fails its HMAC. Only passes are cached.

This module imports the standard library only; the plugins' problems (which
need torch) live with their kernels (e.g.
:mod:`sndr.kernels.turboquant_k8v4.canary`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

PASSED = "canary_passed"
FAILED = "canary_failed"
SKIPPED = "canary_skipped"
_RANK = {PASSED: 0, SKIPPED: 1, FAILED: 2}

_LOCK = threading.RLock()
_RESULTS: dict[tuple[str, str], Result] = {}
_PID = [os.getpid()]
_STORES: dict[str, object] = {}


class Result:
    """One plugin's canary verdict for one problem (a config) in this process."""

    __slots__ = ("plugin", "config", "status", "device", "why", "cached", "ms")

    def __init__(self, plugin: str, config: str, status: str, device: str, why: str = "", cached: bool = False,
                 ms: float = 0.0):
        self.plugin, self.config, self.status, self.device = plugin, config, status, device
        self.why, self.cached, self.ms = why, cached, ms

    @property
    def ok(self) -> bool:
        return self.status == PASSED

    def to_json(self) -> dict:
        return {"plugin": self.plugin, "config": self.config, "status": self.status, "device": self.device,
                "why": self.why, "cached": self.cached, "ms": round(self.ms, 3)}


def _fresh() -> None:
    """A forked child keeps no verdict of its parent's process (its own CUDA context decides)."""
    if _PID[0] != os.getpid():
        _RESULTS.clear()
        _PID[0] = os.getpid()


def results() -> list[dict]:
    """Every verdict of this process, as JSON."""
    with _LOCK:
        _fresh()
        return [r.to_json() for r in _RESULTS.values()]


def reset() -> None:
    """Forget this process's verdicts, open caches and device identities (tests)."""
    with _LOCK:
        _RESULTS.clear()
        _STORES.clear()
        _IDENT.clear()


def known(plugin: str, config: str) -> Result | None:
    """The verdict already reached for (plugin, config) in this process, if any."""
    _fresh()
    return _RESULTS.get((plugin, config))


# ----------------------------------------------------------------------------- identity and the cache

_IDENT: dict[int, tuple[dict, str]] = {}


def _driver_version() -> str:
    """The NVIDIA driver release (``/proc/driver/nvidia/version``), else the driver API version."""
    try:
        with open("/proc/driver/nvidia/version", "rb") as fh:
            head = fh.read(4096).decode("ascii", "replace")
        import re

        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", head)
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        import ctypes

        from . import _cudart

        v = ctypes.c_int()
        if _cudart._driver().cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:  # noqa: BLE001 - no driver library: the kernel cannot run either, the canary says so
        pass
    return "unknown"


def identity(idx: int) -> tuple[dict, str]:
    """(what a cached pass must match, a device line for people) of CUDA device ``idx``: GPU name, compute
    capability, driver, CUDA, torch and triton versions. Shared by every plugin's canary (torch imported here)."""
    if idx not in _IDENT:
        import torch

        name = torch.cuda.get_device_name(idx)
        cap = torch.cuda.get_device_capability(idx)
        drv = _driver_version()
        try:
            import triton

            tri = triton.__version__
        except ImportError:
            tri = "none"
        ident = {"gpu": name, "capability": f"{cap[0]}.{cap[1]}", "driver": drv, "cuda": str(torch.version.cuda),
                 "torch": torch.__version__, "triton": tri}
        _IDENT[idx] = (ident, f"{name} (cuda:{idx}, sm_{cap[0]}{cap[1]}, driver {drv}, CUDA {torch.version.cuda})")
    return _IDENT[idx]


def source_hash(paths: Iterable[str | os.PathLike]) -> str:
    """sha256 over the named files' names and bytes (the kernel sources and their launch code)."""
    h = hashlib.sha256()
    for p in sorted(os.fspath(x) for x in paths):
        with open(p, "rb") as fh:
            data = fh.read()
        h.update(f"{os.path.basename(p)}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


_PACKAGE_HASH: dict[tuple[str, tuple[str, ...]], str] = {}


def package_hash(directory: Path, suffixes: tuple[str, ...]) -> str:
    """:func:`source_hash` of a kernel package's files with these suffixes, computed once per process."""
    key = (str(directory), suffixes)
    if key not in _PACKAGE_HASH:
        _PACKAGE_HASH[key] = source_hash(p for p in directory.iterdir() if p.suffix in suffixes)
    return _PACKAGE_HASH[key]


def entry_name(plugin: str, config: str, identity: Mapping[str, str], kernel_hash: str) -> str:
    blob = json.dumps({"plugin": plugin, "config": config, "identity": dict(identity), "kernel": kernel_hash},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest() + ".json"


class PassCache:
    """Cached passes under ``<cache root>/canary`` (see the module docstring)."""

    def __init__(self, root: str):
        from .. import env
        from ..fsio import PrivateDir

        self._dir = PrivateDir.open(os.path.join(root, env.CACHE_CANARY), "canary cache")
        self._dir.secret()  # created (or checked) now: an unusable secret refuses the whole cache
        self.path = self._dir.path

    def passed(self, name: str, payload: Mapping) -> bool:
        data = self._dir.get_sealed("canary", name, max_bytes=1 << 16)
        if data is None:
            return False
        try:
            got = json.loads(data)
        except ValueError:
            return False
        want = dict(payload, result="pass")
        return isinstance(got, dict) and all(got.get(k) == v for k, v in want.items())

    def store(self, name: str, payload: Mapping) -> None:
        body = dict(payload, result="pass", stored=time.time())
        self._dir.put_sealed("canary", name, json.dumps(body, sort_keys=True).encode())


def open_cache(environ: Mapping[str, str] | None = None) -> PassCache | None:
    """The process's pass cache, or None (logged once) where the cache directory is unsafe or unusable."""
    from .. import env
    from ..fsio import UnsafeDirError
    from ..startup.common import log

    root = str(env.cache_root(environ))
    if root in _STORES:
        return _STORES[root]  # type: ignore[return-value]
    cache = None
    try:
        cache = PassCache(root)
    except UnsafeDirError as exc:
        log(f"{exc}. The canary cache is refused: every canary runs", once_key="canary-unsafe:" + root)
    except OSError as exc:
        log(f"cannot use the canary cache under {root} ({exc.strerror}); every canary runs",
            once_key="canary-nocache:" + root)
    _STORES[root] = cache
    return cache


# ----------------------------------------------------------------------------- the check


def check(plugin: str, config: str, *, device: str, identity: Mapping[str, str], kernel_hash: str,
          run: Callable[[], tuple[float, float]], environ: Mapping[str, str] | None = None) -> Result:
    """Run (or recall) the canary of ``plugin`` on problem ``config``. Never raises, except StrictError.

    ``run()`` builds and launches the kernel on the fixed problem and returns
    ``(error, tolerance)`` against the float64 reference; any exception it
    raises is a ``canary_failed`` naming it. ``identity``: GPU name, driver,
    CUDA runtime (and whatever else the kernel's result depends on).
    """
    with _LOCK:
        _fresh()
        done = _RESULTS.get((plugin, config))
        if done is not None:
            return done
        t0 = time.perf_counter()
        payload = {"plugin": plugin, "config": config, "identity": dict(identity), "kernel": kernel_hash}
        name = entry_name(plugin, config, identity, kernel_hash)
        environ = os.environ if environ is None else environ
        cache = open_cache(environ)
        if cache is not None and cache.passed(name, payload):
            return _record(Result(plugin, config, PASSED, device, "cached pass", True,
                                  (time.perf_counter() - t0) * 1000), environ)
        try:
            err, tol = run()
        except Exception as exc:  # noqa: BLE001 - a build or launch failure is the verdict, never a crash
            first = (str(exc).strip().splitlines() or [""])[0]
            result = Result(plugin, config, FAILED, device, f"{type(exc).__name__}: {first}")
        else:
            if isinstance(err, float) and math.isfinite(err) and err <= tol:
                result = Result(plugin, config, PASSED, device, f"error {err:.3g} <= {tol:.3g}")
                if cache is not None:
                    try:
                        cache.store(name, payload)
                    except OSError as exc:
                        from ..startup.common import log

                        log(f"cannot write the canary cache ({exc.strerror})", once_key="canary-write")
            else:
                result = Result(plugin, config, FAILED, device,
                                f"mismatch: relative error {err:.3g} > {tol:.3g} against the float64 reference")
        result.ms = (time.perf_counter() - t0) * 1000
        return _record(result, environ)


def skip(plugin: str, config: str, device: str, why: str, *, remember: bool = True,
         environ: Mapping[str, str] | None = None) -> Result:
    """Record ``canary_skipped`` (the plugin does not run its kernel here). ``remember=False``: a
    transient reason (the first call inside a CUDA-graph capture); the canary runs at a later call."""
    with _LOCK:
        _fresh()
        result = Result(plugin, config, SKIPPED, device, why)
        if not remember:
            _publish(result)
            return result
        return _record(result, os.environ if environ is None else environ)


#: why a kernel's first call of a shape inside a CUDA-graph capture is not checked there (a transient skip)
IN_CAPTURE = ("first call of this shape inside a CUDA-graph capture; vLLM's kernel is captured for it and the "
              "canary runs at the next eager call")


def skip_in_capture(plugin: str, config: str, device: str) -> Result:
    """Record the transient skip of a first call inside a CUDA-graph capture (:data:`IN_CAPTURE`, not
    remembered: the canary runs at the next eager call of the shape)."""
    return skip(plugin, config, device, IN_CAPTURE, remember=False)


def _record(result: Result, environ: Mapping[str, str]) -> Result:
    _RESULTS[(result.plugin, result.config)] = result
    _publish(result)
    if result.status == FAILED:
        from ..env import strict_mode

        if strict_mode(environ):
            from ..startup.runtime import StrictError

            raise StrictError(f"sndr: {result.plugin} canary_failed on {result.device}: {result.why}\n"
                              "SNDR_STRICT=1: refusing to start vLLM (unset it, or set "
                              f"SNDR_ENABLE_{result.plugin}=0, to serve on vLLM's own kernels)")
    return result


def _publish(result: Result) -> None:
    """Log a verdict other than a pass (once per plugin, status and reason) and hand it to the attestation."""
    from ..startup import hook
    from ..startup.common import log

    if result.status != PASSED:
        tail = ("vLLM's own path runs for it in this process" if result.status == FAILED
                else "vLLM's own path runs for these calls")
        log(f"{result.plugin} {result.status} on {result.device}: {result.why}; {tail}",
            once_key=f"canary:{result.plugin}:{result.status}:{result.why}")
    hook.note_canary(result.to_json())
