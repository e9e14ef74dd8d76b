"""``pin advance``'s performance gate: plugins whose vLLM competitor changed must be re-measured.

The preflight's performance section (:mod:`sndr.preflight.perf`) marks a plugin
``re-measure`` when vLLM's code it replaces or competes with changed between the
pin and the candidate. For each, ``pin advance`` needs a performance reference
(``--perf-ref FILE``: the plugin's benchmark JSON, ``{"plugin": ID, "vllm":
TARGET, ...measurements}``, e.g. ``benchmarks/bench_mtp_verify.py --vllm X``,
newer than the preflight) or a waiver with a reason (``--no-perf-ref
ID=REASON``); :func:`sndr.upstream.pin.advance` records both in the pin.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .gates import PinGate, benchmark_ref_problem, norm_version


def _perf_ref_facts(path: Path) -> tuple[set[str], str | None, str | None]:
    """(plugins it measures, the vLLM version whose kernels it ran against, why it is no perf ref)."""
    if (why := benchmark_ref_problem(path)) is not None:
        return set(), None, why.replace("benchmark reference", "performance reference")
    from ..fsio import read_regular

    try:
        data = json.loads(read_regular(path, what="performance reference"))
    except ValueError:
        return set(), None, f"performance reference {path} is not JSON (the plugin benchmark's --json output)"
    if not isinstance(data, dict):
        return set(), None, f"performance reference {path} is not a JSON object"
    plugins = data.get("plugins", [data.get("plugin")] if data.get("plugin") else [])
    vllm = data.get("vllm")
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins) or not plugins:
        return set(), None, f"performance reference {path} names no plugin (\"plugin\": \"PKnnnn\")"
    if not isinstance(vllm, str) or not vllm:
        return set(), None, (f"performance reference {path} does not say which vLLM's kernels it measured against "
                             "(\"vllm\": \"X\", the benchmark's --vllm X)")
    return set(plugins), vllm, None


def gate_performance(pre: dict, preflight: Path | None, refs: list[Path], waived: dict[str, str],
                     to: str) -> tuple[PinGate, list[str], list[str]]:
    """Plugins the preflight says to ``re-measure`` (their vLLM competitor changed): each needs a performance
    reference (``--perf-ref``: the plugin's benchmark JSON, run against the target's kernels, newer than the
    preflight) or a waiver with a reason (``--no-perf-ref ID=REASON``). Returns (gate, refs, waivers) to record."""
    if not isinstance(pre, dict) or not pre:
        return PinGate("performance", False, "no preflight report to read the performance section from"), [], []
    section = pre.get("performance")
    if not isinstance(section, list):
        return PinGate("performance", False, f"{preflight} has no performance section (a preflight of an older "
                       "sndr): re-run the preflight"), [], []
    due = sorted(str(p.get("id")) for p in section if isinstance(p, dict) and p.get("verdict") == "re-measure")
    target = norm_version(to)
    covered: dict[str, str] = {}
    problems: list[str] = []
    for path in refs:
        if not path.is_file():
            problems.append(f"performance reference {path} does not exist")
            continue
        plugins, vllm, why = _perf_ref_facts(path)
        if why is not None:
            problems.append(why)
            continue
        if vllm is not None and norm_version(vllm) != target:
            problems.append(f"performance reference {path} measured against vLLM {vllm}'s kernels, not {target}")
            continue
        if preflight is not None and preflight.is_file() and path.stat().st_mtime < preflight.stat().st_mtime:
            problems.append(f"performance reference {path} is older than the preflight {preflight}: re-measure")
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        for p in sorted(plugins):
            covered[p] = f"{p} {path} {digest}"
    unknown = sorted(set(waived) - set(due))
    if unknown:
        problems.append(f"--no-perf-ref names {', '.join(unknown)}, which the preflight does not ask to re-measure")
    missing = [p for p in due if p not in covered and p not in waived]
    if missing:
        problems.append(f"{', '.join(missing)}: vLLM's competing code changed (preflight verdict re-measure); run "
                        "the plugin's benchmark against the target's kernels and pass its JSON with --perf-ref, or "
                        "--no-perf-ref ID=REASON")
    if problems:
        return PinGate("performance", False, "; ".join(problems)), [], []
    if not due:
        return PinGate("performance", True, "no performance plugin to re-measure"), [], []
    used = [covered[p] for p in due if p in covered]
    waivers = [f"{p}: {waived[p]}" for p in due if p not in covered]
    parts = [f"{p} re-measured ({covered[p].split(' ')[1]})" if p in covered else f"{p} waived: {waived[p]}"
             for p in due]
    return PinGate("performance", True, "; ".join(parts)), used, waivers
