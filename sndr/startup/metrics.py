"""The patch set as Prometheus metrics: in vLLM's own ``/metrics``, and as a node_exporter textfile.

One fact model, two outlets:

* :func:`facts_of_record` turns an attestation record (what a process proved
  about itself, see :mod:`.attest`) into :class:`Facts`.
* :func:`publish` (called by ``register()`` in every vLLM process) sets gauges
  through ``prometheus_client`` itself. With ``PROMETHEUS_MULTIPROC_DIR`` set,
  the gauges are file-backed with ``multiprocess_mode="liveall"``, so vLLM's
  ``/metrics`` (``get_prometheus_registry()``) shows one sample per *live*
  process, each with its ``pid`` label. Without it, they land in the process's
  default registry (the API server's ``/metrics`` shows its own sample).
* :func:`write_textfile` (``python -m sndr status --prometheus FILE``) writes the
  same gauges for every attested process, atomically, in the text exposition
  format, with ``prometheus_client``'s own writer.

The label set is small and fixed: ``digest``, ``pin``, ``mode`` and ``role`` on
the info gauge, ``role`` on the counts (``pid`` is added by the multiprocess
collector, or by the textfile writer). Patch ids are never labels; they are in
``sndr status``.

Cost: nothing at all when ``prometheus_client`` is neither imported nor
requested by ``PROMETHEUS_MULTIPROC_DIR`` (not even an import attempt). Never
raises into vLLM's startup.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

#: The metric names, one home.
INFO = "sndr_patch_set_info"
ACTIVE = "sndr_patches_active"
MISSING = "sndr_patches_missing"
GATED = "sndr_patches_gated"
RUNTIME_ACTIVE = "sndr_runtime_patches_active"
CANARY_FAILED = "sndr_plugin_canary_failed"
CANARY_SKIPPED = "sndr_plugin_canary_skipped"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_DOC = {
    INFO: "The patch set this vLLM process runs (1 per process): enabled-set digest, pinned vLLM version, "
          "mode (disk|memory|none) and process role.",
    ACTIVE: "Enabled patches that are active in this process.",
    MISSING: "Required patches that are NOT active in this process (0 in a healthy replica).",
    GATED: "Patches of the set that are not enabled here (lifecycle, default, version range, SNDR_ENABLE_*, when).",
    RUNTIME_ACTIVE: "Runtime (object-level) patches installed in this process.",
    CANARY_FAILED: "Performance plugins whose first-use canary failed in this process: they run vLLM's own "
                   "path instead (0 in a healthy replica; sndr status names them and why).",
    CANARY_SKIPPED: "Performance plugins whose canary was skipped in this process (device or call not covered: "
                    "vLLM's own path runs; sndr status says why).",
}


@dataclass(frozen=True)
class Facts:
    """What one process proves about its patch set, as metric values."""

    digest: str
    pin: str
    mode: str
    role: str
    active: int
    missing: int
    gated: int
    runtime_active: int
    pid: int = 0
    canary_failed: int = 0
    canary_skipped: int = 0


def _missing_ids(entries: list[str]) -> set[str]:
    # several lines may name one patch (two changed files, two runtime edits)
    from .attest import missing_patch_id

    return {missing_patch_id(str(m)) for m in entries}


def facts_of_record(record: dict[str, Any]) -> Facts:
    """The metric values of one attestation record (the dict ``register()`` writes)."""
    missing_entries = list(record.get("missing_required") or [])
    missing = _missing_ids(missing_entries)
    enabled = list(record.get("enabled") or [])
    runtime = record.get("runtime") or []
    canary = record.get("canary") or {}
    return Facts(
        digest=str(record.get("patch_set_digest") or ""),
        pin=str(record.get("vllm_version") or ""),
        mode=str(record.get("mode") or "none"),
        role=str(record.get("role") or "unknown"),
        active=len([pid for pid in enabled if pid not in missing]),
        missing=len(missing),
        gated=len(record.get("gated") or []),
        runtime_active=sum(1 for o in runtime if o.get("verdict") == "applied"),
        pid=int(record.get("pid") or 0),
        canary_failed=sum(1 for c in canary.values() if isinstance(c, dict) and c.get("status") == "canary_failed"),
        canary_skipped=sum(1 for c in canary.values() if isinstance(c, dict) and c.get("status") == "canary_skipped"),
    )


# ----------------------------------------------------------------------------- in vLLM's /metrics

_GAUGES: dict[str, Any] | None = None
_LAST_INFO: tuple[str, ...] | None = None
_WARNED = False


def _wanted() -> bool:
    return "prometheus_client" in sys.modules or bool(os.environ.get(MULTIPROC_ENV))


def _gauges() -> dict[str, Any]:
    global _GAUGES, _WARNED
    if _GAUGES is not None:
        return _GAUGES
    try:
        import prometheus_client
        from prometheus_client import values
    except ImportError:
        _GAUGES = {}
        return _GAUGES
    multiproc = bool(os.environ.get(MULTIPROC_ENV))
    if multiproc and getattr(values, "ValueClass", None) is getattr(values, "MutexValue", object()) and not _WARNED:
        _WARNED = True
        from .common import log

        log(f"prometheus_client was imported before {MULTIPROC_ENV} was set: sndr's metrics stay in this "
            f"process's own registry", once_key="metrics-late-multiproc")
    kw: dict[str, Any] = {"multiprocess_mode": "liveall"} if multiproc else {}
    _GAUGES = {
        INFO: prometheus_client.Gauge(INFO, _DOC[INFO], ["digest", "pin", "mode", "role"], **kw),
        ACTIVE: prometheus_client.Gauge(ACTIVE, _DOC[ACTIVE], ["role"], **kw),
        MISSING: prometheus_client.Gauge(MISSING, _DOC[MISSING], ["role"], **kw),
        GATED: prometheus_client.Gauge(GATED, _DOC[GATED], ["role"], **kw),
        RUNTIME_ACTIVE: prometheus_client.Gauge(RUNTIME_ACTIVE, _DOC[RUNTIME_ACTIVE], ["role"], **kw),
        CANARY_FAILED: prometheus_client.Gauge(CANARY_FAILED, _DOC[CANARY_FAILED], ["role"], **kw),
        CANARY_SKIPPED: prometheus_client.Gauge(CANARY_SKIPPED, _DOC[CANARY_SKIPPED], ["role"], **kw),
    }
    return _GAUGES


def publish(record: dict[str, Any]) -> bool:
    """Set this process's gauges from its attestation record. Returns whether anything was published.

    Called by ``register()`` after the record is written, and again whenever the
    record changes (a deferred runtime patch installs, the hook serves a module).
    """
    global _LAST_INFO
    if not _wanted():
        return False
    try:
        gauges = _gauges()
        if not gauges:
            return False
        f = facts_of_record(record)
        info = (f.digest, f.pin, f.mode, f.role)
        if _LAST_INFO is not None and _LAST_INFO != info:
            # Multiprocess files cannot drop a sample: the old one goes to 0 (alerts select == 1).
            gauges[INFO].labels(*_LAST_INFO).set(0)
        gauges[INFO].labels(*info).set(1)
        _LAST_INFO = info
        gauges[ACTIVE].labels(f.role).set(f.active)
        gauges[MISSING].labels(f.role).set(f.missing)
        gauges[GATED].labels(f.role).set(f.gated)
        gauges[RUNTIME_ACTIVE].labels(f.role).set(f.runtime_active)
        gauges[CANARY_FAILED].labels(f.role).set(f.canary_failed)
        gauges[CANARY_SKIPPED].labels(f.role).set(f.canary_skipped)
        return True
    except Exception as exc:  # noqa: BLE001 - metrics must never break vLLM's startup
        from .common import describe, log

        log(f"could not publish patch-set metrics: {describe(exc)}", once_key="metrics-failed")
        return False


def _reset_for_tests() -> None:
    global _GAUGES, _LAST_INFO
    _GAUGES, _LAST_INFO = None, None


# ----------------------------------------------------------------------------- node_exporter textfile


def write_textfile(path: str, records: list[dict[str, Any]], findings: list[str]) -> None:
    """Write every record's gauges (``pid`` labelled) plus ``sndr_status_ok`` to ``path``, atomically.

    Uses ``prometheus_client``'s exposition writer on a private registry; the
    file is written by the one output writer (:func:`sndr.cli.write_output`): an
    atomic replace, so the collector never reads half a file, and never over a
    symlink, FIFO, device or another user's file (refused, exit 2).
    """
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    from ..cli import write_output

    reg = CollectorRegistry()
    info = Gauge(INFO, _DOC[INFO], ["digest", "pin", "mode", "role", "pid"], registry=reg)
    counts = {name: Gauge(name, _DOC[name], ["role", "pid"], registry=reg)
              for name in (ACTIVE, MISSING, GATED, RUNTIME_ACTIVE, CANARY_FAILED, CANARY_SKIPPED)}
    ok = Gauge("sndr_status_ok", "1 when every attested process runs one patch set with nothing missing "
                                 "(python -m sndr status exit 0).", registry=reg)
    nfind = Gauge("sndr_status_findings", "Findings of python -m sndr status (see its output for the text).",
                  registry=reg)
    for r in records:
        f = facts_of_record(r)
        pid = str(f.pid)
        info.labels(f.digest, f.pin, f.mode, f.role, pid).set(1)
        counts[ACTIVE].labels(f.role, pid).set(f.active)
        counts[MISSING].labels(f.role, pid).set(f.missing)
        counts[GATED].labels(f.role, pid).set(f.gated)
        counts[RUNTIME_ACTIVE].labels(f.role, pid).set(f.runtime_active)
        counts[CANARY_FAILED].labels(f.role, pid).set(f.canary_failed)
        counts[CANARY_SKIPPED].labels(f.role, pid).set(f.canary_skipped)
    ok.set(0 if findings else 1)
    nfind.set(len(findings))
    write_output(path, generate_latest(reg), "--prometheus", mode=0o644)
