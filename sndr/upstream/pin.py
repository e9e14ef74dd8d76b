"""The pin and its gates: ``python -m sndr pin show|advance``.

``pin advance --to TARGET`` records a new pin (``patches/_pin.toml``) only when
every gate passes, and names each gate that fails:

- **preflight**: a preflight report of the patch set on the target, with no
  genuine anchor drift;
- **manifest**: the target's manifest, built from this patch set on this tree;
- **queue**: the ``sync plan --json`` queue of the range up to the target: no
  queued commit (applicable, review or conflict) and no refused revert half is
  left without a recorded decision (``sync decide``), and every ``ported-as``
  names a patch of the set;
- **deviations**: every deviation the range touches is reviewed for the
  target (``sync deviation PATCH --reviewed TARGET``) or dropped;
- **benchmark**: the denominator. A benchmark reference re-measured on the
  target, a file the operator names (``--benchmark-ref``), newer than the
  preflight. Required unless ``--no-benchmark-ref`` says why not; recorded in
  the pin with its sha256;
- **performance**: each plugin the preflight's performance section marks
  ``re-measure`` (vLLM's competing code changed) has a ``--perf-ref`` JSON
  (``{"plugin": ID, "vllm": TARGET, ...measurements}``, the plugin's benchmark
  against the target's kernels, newer than the preflight) or a
  ``--no-perf-ref ID=REASON``; both are recorded in the pin.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import EXIT_FINDINGS, EXIT_OK, bad_input
from ..pinrecord import PinRecord, default_pin_path, read_pin, writable_pin_path
from .decisions import DECISIONS_NAME, Decisions, load_decisions
from .gates import PinGate, benchmark_ref_problem, norm_version, same_target
from .report import QUEUED, DeviationHit, QueueReport

__all__ = ["advance", "gate_benchmark", "gate_deviations", "gate_manifest", "gate_preflight", "gate_queue", "run_pin"]

_SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


def _read_json(path: Path, what: str) -> Any:
    from .watchlist import read_text_file  # strict UTF-8 through sndr.fsio, problems as bad input

    text = read_text_file(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input("bad_json", f"malformed JSON: {exc.msg}", file=str(path), line=exc.lineno) from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit integer (int max str digits), nesting too deep
        raise bad_input("bad_json", f"unusable JSON: {str(exc).split(';')[0]}", file=str(path)) from None


def _target_matches(to: str, version: str | None, sha: str | None) -> bool | None:
    """Whether a recorded target names ``to``; None when the record says nothing comparable."""
    if _SHA_RE.match(to) and sha:
        return sha.startswith(to) or to.startswith(sha)
    if version:
        return norm_version(version) == norm_version(to) or (sha is not None and sha.startswith(to))
    return None


def _manifest_name(version: str) -> str:
    try:
        from ..manifest import manifest_name
    except ImportError:  # pragma: no cover
        return f"vllm-{version}.json"
    return manifest_name(version)


def _preflight_set_problem(data: dict, path: Path, patch_set) -> str | None:
    """Why the preflight's recorded patch set is not ``patch_set`` (None when it is)."""
    want = patch_set.digest()
    rec = data.get("patch_set")
    rec = rec if isinstance(rec, dict) else {}
    # the whole-set digest (PatchSetInfo.digest); an enabled-set digest, where a report records one, also counts
    got = [d for d in (rec.get("digest"), rec.get("enabled_digest")) if isinstance(d, str) and d]
    if not got:
        return (f"{path} records no patch-set digest, so it cannot show it was run on this patch set (digest "
                f"{want[:12]}); re-run the preflight with this --patches")
    if want in got:
        return None
    where = f" ({rec['directory']})" if isinstance(rec.get("directory"), str) else ""
    return (f"{path} was run on another patch set{where}: digest {got[0][:12]}, but the set being advanced"
            f"{' (' + str(patch_set.directory) + ')' if getattr(patch_set, 'directory', None) else ''} has "
            f"digest {want[:12]}; re-run the preflight with this --patches")


def _refuse_a_same_version_report(data: dict, path: Path) -> None:
    """A preflight whose pin and candidate are one vLLM version (its ``warnings`` carry ``same_version``,
    :func:`sndr.preflight.snapshot.same_release`) compared two builds of one release: the patches' vllm ranges
    read alike on both, so it is no evidence for a bump and the pin is never advanced on it (``not_a_bump``)."""
    warned = data.get("warnings")
    hit = next((w for w in warned if isinstance(w, dict) and w.get("code") == "same_version"), None) \
        if isinstance(warned, list) else None
    if hit is not None:
        said = hit.get("message") if isinstance(hit.get("message"), str) else "pin and candidate are one version"
        raise bad_input("not_a_bump", f"the preflight report compares two builds of one vLLM version, not a bump: "
                        f"{said}", file=str(path), key="--preflight",
                        hint="re-run the preflight with the current pin as --pin and the target as --candidate")


def gate_preflight(path: Path | None, to: str, patch_set=None) -> tuple[PinGate, dict]:
    if path is None:
        return PinGate("preflight", False, "no preflight report given (--preflight)"), {}
    data = _read_json(path, "preflight report")
    if not isinstance(data, dict) or "genuine_anchor_drift" not in data:
        return PinGate("preflight", False, f"{path} is not a preflight report (no genuine_anchor_drift)"), {}
    _refuse_a_same_version_report(data, path)
    cand = data.get("candidate")
    cver = cand if isinstance(cand, str) else (cand.get("version") if isinstance(cand, dict) else None)
    csha = cand.get("sha") if isinstance(cand, dict) else None
    match = _target_matches(to, cver, csha)
    if match is False:
        return PinGate("preflight", False, f"the preflight's candidate is {cver or csha}, not {to}"), data
    if patch_set is not None and (why := _preflight_set_problem(data, path, patch_set)):
        return PinGate("preflight", False, why), data
    drift = data.get("genuine_anchor_drift") or []
    if drift:
        names = []
        for d in drift:
            names.append(d if isinstance(d, str) else str(d.get("patch") or d.get("id") or d))
        return PinGate("preflight", False, f"genuine anchor drift in {len(drift)} edit(s): "
                    f"{', '.join(sorted(set(names))[:8])}"), data
    return PinGate("preflight", True, "no genuine anchor drift"), data


def _manifest_pairs(obj: Any) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            pid = cur.get("patch")
            name = cur.get("name") or cur.get("edit")
            if isinstance(pid, str) and isinstance(name, str):
                pairs.add((pid, name))
            stack.extend(cur.values())
        elif isinstance(cur, list):
            stack.extend(cur)
    return pairs


#: Edit verdicts that fail the manifest gate on an enabled patch (the ones `manifest build` reports).
FAILING_VERDICTS = ("drifted", "ambiguous", "file_missing", "conflict")


def rebuild_hint(path: Path, to: str, patch_set=None) -> str:
    """The command that rebuilds the manifest ``path`` of ``to`` (``python -m sndr manifest build``)."""
    from ..env import is_shipped_data
    from ..manifest import build_command

    tree = f"git:REPO@{to}" if _SHA_RE.match(to) else f"vllm=={norm_version(to)}"
    pdir = getattr(patch_set, "directory", None)
    if is_shipped_data(path):  # an installed sndr's anchors: manifest build refuses to write there
        return f"{build_command(tree, pdir, path.name)}, then pass --manifest {path.name} to pin advance"
    return build_command(tree, pdir, path)


def _manifest_failures(data: dict) -> list[str]:
    """``PATCH.edit: verdict`` of every failing edit (or failed patch) of an enabled patch the manifest records."""
    out: list[str] = []
    for p in data.get("patches") or []:
        if not isinstance(p, dict) or p.get("status") in ("gated", "left_out"):
            continue
        pid = str(p.get("id"))
        bad = [f"{pid}.{e.get('name')}: {e.get('verdict')}" for e in p.get("edits") or []
               if isinstance(e, dict) and e.get("verdict") in FAILING_VERDICTS
               and (e.get("required", True) or e.get("group"))]
        if not bad and p.get("status") == "failed":
            bad = [f"{pid}: failed{' (' + str(p['reason_code']) + ')' if p.get('reason_code') else ''}"]
        out += bad
    return out


def gate_manifest(path: Path, to: str, patch_set, tree_digest: str | None = None) -> PinGate:
    if not path.exists():
        return PinGate("manifest", False, f"no manifest {path}: rebuild it for {to} "
                       f"({rebuild_hint(path, to, patch_set)})")
    data = _read_json(path, "manifest")
    if not isinstance(data, dict):
        return PinGate("manifest", False, f"{path} is not a manifest")
    pin = data.get("pin")
    version = data.get("vllm_version") or data.get("version") or (pin.get("version") if isinstance(pin, dict) else pin)
    if isinstance(version, str) and _target_matches(to, version, None) is False and not _SHA_RE.match(to):
        return PinGate("manifest", False, f"{path} was built for {version}, not {to}")
    built_on = data.get("tree_digest")
    if tree_digest and isinstance(built_on, str) and built_on != tree_digest:
        return PinGate("manifest", False, f"{path} was built on tree {built_on[:12]}, but the preflight's candidate is "
                    f"{tree_digest[:12]}; rebuild it on the target")
    failing = _manifest_failures(data)
    if failing:
        return PinGate("manifest", False, f"{path} records {len(failing)} failing edit(s) of enabled patches on "
                       f"{to}: {', '.join(failing[:5])}{' ...' if len(failing) > 5 else ''}; port them and rebuild "
                       f"it ({rebuild_hint(path, to, patch_set)})")
    if patch_set is not None:
        digest = data.get("patch_set_digest")
        if isinstance(digest, str):
            if digest != patch_set.digest():
                return PinGate("manifest", False, f"{path} was built from another patch set (digest "
                            f"{digest[:12]}); rebuild it")
            return PinGate("manifest", True, f"{path} matches the patch set")
        pairs = _manifest_pairs(data)
        if pairs:
            want = {(p.id, e.name) for p in patch_set.patches if p.lifecycle != "retired" for _, e in p.edits()}
            missing = sorted(want - pairs)
            if missing:
                return PinGate("manifest", False, f"{path} lacks {len(missing)} edit(s) of the patch set, e.g. "
                            f"{missing[0][0]}/{missing[0][1]}; rebuild it")
            return PinGate("manifest", True, f"{path} covers every edit of the patch set")
    return PinGate("manifest", True, f"{path} present")


def load_queue(path: Path) -> QueueReport:
    data = _read_json(path, "queue report")
    try:
        return QueueReport.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise bad_input("bad_queue", f"not a queue report: {err.get('msg')}", file=str(path),
                        key=".".join(str(p) for p in err.get("loc", ())) or None) from None


def _shown(entries, limit: int = 5) -> str:
    out = ", ".join(f"{c.sha[:10]} {c.subject!r}" for c in entries[:limit])
    return out + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def gate_queue(rep: QueueReport | None, to: str, decisions: Decisions, patch_set=None) -> PinGate:
    """No queued commit (or refused revert half) without a recorded resolution."""
    if rep is None:
        return PinGate("queue", False, "no queue report given (--queue, from `sync plan --json`)")
    if _target_matches(to, rep.to_ref, rep.to_sha) is False:
        return PinGate("queue", False, f"the queue is for {rep.to_ref} ({rep.to_sha[:10]}), not {to}")
    if patch_set is not None and rep.patch_set_digest and rep.patch_set_digest != patch_set.digest():
        return PinGate("queue", False, f"the queue was planned for another patch set ({rep.patches_dir or '?'}, "
                       f"digest {rep.patch_set_digest[:12]}), not the one being advanced"
                       f"{' (' + str(patch_set.directory) + ')' if getattr(patch_set, 'directory', None) else ''}"
                       f", digest {patch_set.digest()[:12]}; re-plan it with this --patches")
    open_items = [c for c in rep.commits if c.status in QUEUED + ("refused",)]
    undecided = [c for c in open_items if not ((d := decisions.for_sha(c.sha)) and d.decided)]
    if undecided:
        kinds: dict[str, list] = {}
        for c in undecided:
            kinds.setdefault("applicable" if c.disposition == "applicable" and c.status != "refused"
                             else c.status if c.status == "refused"
                             else f"blocked by {', '.join(s[:10] for s in c.blocked_by)}" if c.blocked_by
                             else c.disposition, []).append(c)
        parts = [f"{len(v)} {k}: {_shown(v)}" for k, v in sorted(kinds.items())]
        return PinGate("queue", False, f"{len(undecided)} queued commit(s) without a decision ({'; '.join(parts)}); "
                    "port them, or record one with `sync decide SHA --resolution ...`")
    if patch_set is not None:
        ids = {p.id for p in patch_set.patches}
        bad = [(c, d.ported_as) for c in open_items if (d := decisions.for_sha(c.sha)) and d.ported_as
               and d.ported_as not in ids]
        if bad:
            return PinGate("queue", False, f"{len(bad)} decision(s) name a patch that is not in the patch set: "
                        + ", ".join(f"{c.sha[:10]} ported-as {pid}" for c, pid in bad[:5]))
    res: dict[str, int] = {}
    for c in open_items:
        d = decisions.for_sha(c.sha)
        assert d is not None and d.resolution is not None  # no item is undecided (returned above)
        key = d.resolution.split(" ", 1)[0]
        res[key] = res.get(key, 0) + 1
    detail = ", ".join(f"{n} {k}" for k, n in sorted(res.items()))
    return PinGate("queue", True, f"every queued commit decided ({len(open_items)}: {detail})" if open_items
                else "no queued commit left")


def _late_deviations(rep: QueueReport, decisions: Decisions,
                     patch_files: dict[str, list[str]]) -> tuple[list[DeviationHit], list[str]]:
    """The deviations recorded after ``rep`` was planned (not among the ones it checked): (hits on the files
    its commits change, ids the queue cannot judge because they live outside its mirrored surface)."""
    from .queue import Surface

    known = {h.patch for h in rep.deviations} | set(rep.deviations_checked or [])
    surface = Surface(set(rep.surface.files), list(rep.surface.globs))
    hits: list[DeviationHit] = []
    unknown: list[str] = []
    for dev in decisions.deviations:
        if dev.patch in known:
            continue
        paths = list(dev.paths) or list(patch_files.get(dev.patch, []))
        touched = [e.sha for e in rep.commits if any(f.path in paths or f.old_path in paths for f in e.files)]
        if touched:
            hits.append(DeviationHit(patch=dev.patch, upstream=dev.upstream, why=dev.why, paths=paths,
                                     touched_by=touched, discharge=dev.discharge, reviewed=dev.reviewed))
        elif any(not surface.matches(p) for p in paths):
            unknown.append(dev.patch)
    return hits, unknown


def gate_deviations(rep: QueueReport | None, to: str, decisions: Decisions,
                    patch_files: dict[str, list[str]] | None = None) -> PinGate:
    """Every deviation the range touches is reviewed for ``to`` or dropped: the queue's hits, and the
    deviations recorded after it was planned, judged on the files its commits change (``patch_files``:
    patch id -> files, for deviations that do not list their paths)."""
    if rep is None:
        return PinGate("deviations", False, "no queue report given (--queue)")
    late, unknown = _late_deviations(rep, decisions, patch_files or {})
    if unknown:
        return PinGate("deviations", False, f"{len(unknown)} deviation(s) recorded after the queue was planned "
                       f"live outside its mirrored surface ({', '.join(unknown)}): the queue cannot say whether "
                       "the range touches them; re-run `sync plan` for the queue")
    stale = []
    for hit in [*rep.deviations, *late]:
        dev = decisions.deviation(hit.patch)
        if dev is None:
            continue  # dropped: discharged or no longer a deviation
        r = dev.reviewed
        if r and same_target(r, to):
            continue
        dis = f"; its discharge {hit.discharge_in_range[:10]} is in range: drop it if it is discharged" \
            if hit.discharge_in_range else ""
        stale.append(f"{hit.patch}{' (' + hit.upstream + ')' if hit.upstream else ''} touched by "
                     f"{len(hit.touched_by)} commit(s) ({', '.join(s[:10] for s in hit.touched_by[:5])}), reviewed for "
                     f"{dev.reviewed or 'nothing'}{dis}")
    if stale:
        return PinGate("deviations", False, f"{len(stale)} deviation(s) not updated for {to}: " + "; ".join(stale)
                    + f" (run `sync deviation PATCH --reviewed {to}` after checking each)")
    n = len(rep.deviations) + len(late)
    return PinGate("deviations", True, f"{n} touched deviation(s), all reviewed for {to} or dropped"
                   if n else "the range touches no deviation")


def gate_benchmark(path: Path | None, preflight: Path | None, waived: str | None = None) -> PinGate:
    """The denominator: a benchmark reference re-measured on the target, newer than the preflight."""
    if path is None:
        if waived:
            return PinGate("benchmark", True, f"not required: {waived}")
        return PinGate("benchmark", False, "no benchmark reference given: re-measure the benchmark on the target and "
                    "pass the file with --benchmark-ref (or --no-benchmark-ref REASON)")
    if not path.is_file():
        return PinGate("benchmark", False, f"benchmark reference {path} does not exist: re-measure on the target")
    if (why := benchmark_ref_problem(path)) is not None:
        return PinGate("benchmark", False, why)
    if preflight is not None and preflight.is_file() and path.stat().st_mtime < preflight.stat().st_mtime:
        return PinGate("benchmark", False, f"benchmark reference {path} is older than the preflight {preflight}: "
                    "re-measure on the target")
    return PinGate("benchmark", True, f"{path} re-measured after the preflight")


def advance(to: str, *, preflight: Path | None, queue: Path | None, manifest: Path | None = None,
            anchors_dir: Path | None = None, patch_set=None, pin_path: Path | None = None,
            version: str | None = None, tree_digest: str | None = None, dry_run: bool = False,
            decisions: Path | Decisions | None = None, benchmark: Path | None = None,
            benchmark_waived: str | None = None, perf_refs: list[Path] | None = None,
            perf_waived: dict[str, str] | None = None) -> tuple[list[PinGate], PinRecord | None]:
    """Check every gate; write the pin record when all pass (and not ``dry_run``)."""
    to = to.strip()
    if not to:
        raise bad_input("bad_target", "--to is empty", key="to")
    is_sha = bool(_SHA_RE.match(to))
    if not is_sha:
        from packaging.version import InvalidVersion, Version

        try:
            ver = Version(norm_version(to))
        except InvalidVersion:
            raise bad_input("bad_target", f"--to {to!r} is neither a PEP 440 version nor a commit sha", key="to") from None
        if len(ver.release) < 3 and str(ver) == ".".join(map(str, ver.release)):
            # a plain short release: 0.33 is PEP 440's 0.33.0, vLLM's spelling, which the preflight, the
            # manifest and the queue record, and which the pin records
            to = ".".join(map(str, ver.release + (0,) * (3 - len(ver.release))))
    target = None if dry_run else writable_pin_path(pin_path, getattr(patch_set, "directory", None))
    if target is not None:
        from ..cli import check_output

        check_output(target, "--pin-file")  # before the gates: a pin record is never written through a link
    gates: list[PinGate] = []
    g, pre = gate_preflight(preflight, to, patch_set)
    gates.append(g)
    cand = pre.get("candidate") if isinstance(pre, dict) else None
    cand_digest = cand.get("tree_digest") if isinstance(cand, dict) else None
    cand_digest = cand_digest if isinstance(cand_digest, str) and re.fullmatch(r"[0-9a-f]{64}", cand_digest) else None
    if manifest is None:
        if anchors_dir is None:
            from ..load import shipped_anchors_dir

            anchors_dir = shipped_anchors_dir()
        manifest = Path(anchors_dir) / _manifest_name(norm_version(to) if not is_sha else to)
    gates.append(gate_manifest(Path(manifest), to, patch_set, cand_digest))
    if not isinstance(decisions, Decisions):
        decisions = load_decisions(decisions).model
    rep = load_queue(Path(queue)) if queue is not None else None
    gates.append(gate_queue(rep, to, decisions, patch_set))
    gates.append(gate_deviations(rep, to, decisions, {p.id: [f.path for f in getattr(p, "files", []) or []]
                                                      for p in getattr(patch_set, "patches", [])}))
    gates.append(gate_benchmark(Path(benchmark) if benchmark is not None else None,
                                Path(preflight) if preflight is not None else None, benchmark_waived))
    from .perfgate import gate_performance  # imported when advance runs (pin show never needs it)

    pg, used_refs, waivers = gate_performance(pre, Path(preflight) if preflight is not None else None,
                                              [Path(p) for p in perf_refs or []], dict(perf_waived or {}), to)
    gates.append(pg)
    if not all(g.ok for g in gates):
        return gates, None
    if version is None:
        version = norm_version(to) if not is_sha else (
            cand if isinstance(cand, str) else (cand or {}).get("version") if isinstance(cand, dict) else None)
    if not version:
        raise bad_input("no_version", f"--to {to} is a commit; give --version for the pin record", key="version")
    if tree_digest is None:
        tree_digest = cand_digest
    if tree_digest is None and Path(manifest).exists():
        d = _read_json(Path(manifest), "manifest").get("tree_digest")
        tree_digest = d if isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) else None
    bench_sha = hashlib.sha256(Path(benchmark).read_bytes()).hexdigest() if benchmark is not None else None
    record = PinRecord(version=norm_version(version), sha=to if is_sha else None, tree_digest=tree_digest,
                       benchmark_ref=str(benchmark) if benchmark is not None else None, benchmark_sha256=bench_sha,
                       benchmark_waived=benchmark_waived if benchmark is None else None,
                       perf_refs=used_refs or None, perf_waived=waivers or None)
    if not dry_run:
        from ..cli import write_output

        assert target is not None  # resolved (and refused if shipped data) before the gates
        write_output(target, record.to_toml(), "--pin-file")
    return gates, record


def _waivers(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        pid, sep, why = item.partition("=")
        if not sep or not pid.strip() or not why.strip():
            raise bad_input("usage", f"--no-perf-ref {item!r}: expected ID=REASON (e.g. PK0003=\"GDN path unused\")",
                            key="--no-perf-ref")
        out[pid.strip()] = why.strip()
    return out


def run_pin(args) -> int:
    """``sndr pin show|advance`` (its options: :mod:`sndr.commands.pin`)."""
    if args.cmd == "show":
        path = Path(args.pin_file) if args.pin_file else default_pin_path(args.patches)
        rec = read_pin(path)
        if rec is None:  # the pin is still sndr's own (what manifest and apply validate on): say which
            from ..pinrecord import pin_version

            print(f"{path}: no pin recorded; the pin is sndr's own, vllm {pin_version(None)[0]} (`python -m sndr "
                  f"pin advance` records one)")
            return EXIT_OK
        print(f"{path}: " + ", ".join(f"{k}={v}" for k, v in rec.model_dump(exclude_none=True).items()))
        return EXIT_OK
    digest = None
    if args.tree:
        from ..tree import open_tree

        digest = open_tree(args.tree).digest
    from ..env import patches_dir
    from ..load import load_patch_set

    # the patch set being advanced: --patches, else the one the queue was planned for, else $SNDR_PATCHES/shipped
    recorded = load_queue(Path(args.queue)).patches_dir if args.queue else None
    pdir = Path(args.patches) if args.patches else Path(recorded) if recorded else patches_dir()
    ps = load_patch_set(pdir)
    pin_path = None if args.dry_run else writable_pin_path(args.pin_file, pdir)
    gates, record = advance(args.to, preflight=Path(args.preflight) if args.preflight else None,
                            queue=Path(args.queue) if args.queue else None,
                            manifest=Path(args.manifest) if args.manifest else None, patch_set=ps,
                            pin_path=pin_path, version=args.version,
                            tree_digest=digest, dry_run=args.dry_run,
                            decisions=Path(args.decisions) if args.decisions else pdir / DECISIONS_NAME,
                            benchmark=Path(args.benchmark_ref) if args.benchmark_ref else None,
                            benchmark_waived=args.no_benchmark_ref,
                            perf_refs=[Path(p) for p in args.perf_ref], perf_waived=_waivers(args.no_perf_ref))
    for g in gates:
        print(f"gate {g.name}: {'pass' if g.ok else 'FAIL'}: {g.reason}")
    if record is None:
        failed = [g.name for g in gates if not g.ok]
        print(f"refused: pin not advanced to {args.to}; failed gate(s): {', '.join(failed)}", file=sys.stderr)
        return EXIT_FINDINGS
    where = "(dry run, nothing written)" if args.dry_run else str(pin_path)
    print(f"pin advanced to {record.version}{' @ ' + record.sha if record.sha else ''} {where}")
    return EXIT_OK
