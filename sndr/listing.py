"""The patch set at a glance (the command: :mod:`sndr.commands.list`).

One row per patch: id, title, kind, default, upstream references and the
files (or runtime targets, or plugin module) it touches. With ``--tree`` each
row also gets the patch's verdict on that tree, computed by the same planner
``apply --dry-run`` uses (so the two can never disagree), and ``--verdict``
keeps only the rows with that verdict.

A patch's verdict is its plan status (``applies``, ``applied``, ``merged``,
``gated``, ``failed``, ``partial``); ``--verdict`` also accepts an edit
verdict (``drifted``, ``ambiguous``, ``file_missing``, ...) and then keeps the
patches with at least one edit that has it.

With ``--profile FILE`` each row says whether that deployment profile gets
the patch (``enabled``) or not (``gated``, with the reason: its ``when``, its
version range, ...), by the same :func:`sndr.plan.enabled_set` apply uses;
without ``--tree`` the gates read the pinned vLLM version.

The rows are a pure function (:func:`list_rows`) of the patch set and an
optional plan; the CLI around it is thin.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import EXIT_OK, Problem, SndrError
from .load import PatchSet, load_patch_set
from .model import Patch, Verdict
from .state import STATE_DIR

PATCH_STATUSES = ("applies", "applied", "merged", "gated", "failed", "partial", "nothing_to_do", "left_out",
                  "enabled")
EDIT_VERDICTS = tuple(v.value for v in Verdict)
VERDICTS = tuple(dict.fromkeys(PATCH_STATUSES + EDIT_VERDICTS))

__all__ = ["Row", "VERDICTS", "list_rows", "render_table", "run_list"]


@dataclass
class Row:
    id: str
    title: str
    kind: str
    default: bool
    lifecycle: str
    upstream: list[str]
    files: list[str]
    when: dict | None = None
    verdict: str | None = None  # the patch's status on --tree (or enabled/gated for --profile)
    edit_verdicts: list[str] = field(default_factory=list)  # distinct edit verdicts on --tree
    reason: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        if self.when is None:
            out.pop("when")
        if self.verdict is None:
            for key in ("verdict", "edit_verdicts", "reason"):
                out.pop(key)
        return out


def touched(p: Patch) -> list[str]:
    """What a patch touches: its files, its runtime targets, its plugin module."""
    out = [f.path for f in p.files]
    out += [f"runtime {r.target}" for r in p.runtime]
    if p.module:
        out.append(f"module {p.module}")
    return out


def list_rows(patch_set: PatchSet, plan=None, verdict: str | None = None, gates=None) -> list[Row]:
    """Rows in patch-set order; with a plan, each carries its verdict (and ``verdict`` filters).

    ``gates`` (id -> :class:`sndr.plan.Gate`, from ``enabled_set``) without a
    plan: each row says ``enabled`` or ``gated`` with the gate's reason.
    """
    results = {r.id: r for r in plan.patches} if plan is not None else {}
    rows = []
    for p in patch_set.patches:
        row = Row(id=p.id, title=p.title, kind=p.kind, default=p.default, lifecycle=p.lifecycle,
                  upstream=list(p.upstream), files=touched(p), when=dict(p.when) if p.when else None)
        r = results.get(p.id)
        if plan is not None and r is not None:
            row.verdict = r.status
            row.edit_verdicts = sorted({e.verdict.value for e in r.edits})
            row.reason = r.reason
        elif gates is not None and p.id in gates:
            g = gates[p.id]
            row.verdict = "enabled" if g.enabled else "gated"
            row.reason = f"{g.code}: {g.reason}" if g.code else ""  # enabled with a note too (when_forced)
        if verdict is not None and verdict != row.verdict and verdict not in row.edit_verdicts:
            continue
        rows.append(row)
    return rows


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def render_table(rows: list[Row], *, with_verdict: bool, title_width: int = 60) -> str:
    """A plain-text table: one line per patch, files on continuation lines."""
    headers = ["ID", "KIND", "DEFAULT"] + (["VERDICT"] if with_verdict else []) + ["UPSTREAM", "TITLE"]
    table = []
    reasons = {r.id: r.reason for r in rows if r.verdict in ("gated", "failed", "left_out", "nothing_to_do")}
    for r in rows:
        cells = [r.id, r.kind, "yes" if r.default else "no"]
        if with_verdict:
            cells.append(r.verdict or "-")
        cells += [",".join(r.upstream) or "-", _clip(r.title, title_width)]
        table.append((cells, r.files))
    widths = [max([len(h)] + [len(c[i]) for c, _ in table]) for i, h in enumerate(headers)]
    indent = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(headers)]
    for cells, files in table:
        out.append(line(cells))
        out += [f"{indent}{f}" for f in files]
        if with_verdict and reasons.get(cells[0]):
            out.append(f"{indent}why: {reasons[cells[0]]}")
    return "\n".join(out)


def summary(rows: list[Row], with_verdict: bool) -> str:
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    text = f"{len(rows)} patch(es): " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    if with_verdict:
        verdicts: dict[str, int] = {}
        for r in rows:
            verdicts[r.verdict or "-"] = verdicts.get(r.verdict or "-", 0) + 1
        text += "; " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    return text


# ----------------------------------------------------------------------------- CLI


def run_list(args) -> int:
    """``sndr list`` (its options: :mod:`sndr.commands.list`): the rows, as a table or ``--json FILE|-``."""
    if args.verdict and args.verdict not in VERDICTS:
        raise SndrError(Problem("usage", f"--verdict {args.verdict!r}: choose from {', '.join(VERDICTS)}",
                                key="--verdict"))
    if args.verdict and not (args.tree or args.profile):
        raise SndrError(Problem("usage", "--verdict needs --tree (or --profile): a verdict is about one tree",
                                key="--verdict",
                                hint="e.g. python -m sndr list --tree vllm==0.33.0 --verdict drifted"))
    patch_set = load_patch_set(args.patches)
    from .plan import unknown_enable_vars

    for line in unknown_enable_vars(patch_set, os.environ) + [w.render() for w in patch_set.warnings]:
        print(f"sndr list: note: {line}", file=sys.stderr)  # never silently ignored (stderr: --json stays JSON)
    plan = None
    ledger = None
    patched: set[str] = set()
    version = None
    gates = None
    profile = None
    if args.profile:
        from .profile import load_profile

        profile = load_profile(args.profile)
    if args.tree:
        from .plan import build_plan
        from .tree import open_tree

        tree = open_tree(args.tree)
        version = tree.version
        reader, ledger, patched = _sndr_state(tree)
        plan = build_plan(patch_set, reader, version, environ=os.environ, check_compile=False,
                          profile=profile)
        if ledger is not None:
            _as_held(plan, ledger, patched)
    elif profile is not None:
        from . import PIN_VERSION
        from .plan import enabled_set

        version = PIN_VERSION
        gates = enabled_set(patch_set, version, os.environ, profile=profile).gates
    rows = list_rows(patch_set, plan, args.verdict, gates)
    if args.kind:
        rows = [r for r in rows if r.kind == args.kind]
    if args.json:
        doc = {"tree": args.tree, "vllm_version": version, "profile": args.profile,
               "patches": [r.to_json() for r in rows]}
        if plan is not None:  # the digest apply would write into the ledger (and the hook attests)
            doc["enabled"] = list(plan.enabled)  # plan.enabled_set's ids, as the digest below
            doc["patch_set_digest"] = plan.digest
        if ledger is not None:
            doc["patched_by_sndr"] = {"enabled_set_digest": ledger.patch_set_digest, "patches": list(ledger.patches),
                                      "files_not_holding_patched_bytes": sorted(set(ledger.files) - patched)}
        from .cli import write_output

        write_output(args.json, json.dumps(doc, indent=2) + "\n", "--json")
        if args.json == "-":
            return EXIT_OK  # stdout holds the JSON document only
    with_verdict = plan is not None or gates is not None
    if args.tree:
        print(f"tree: {args.tree} (vLLM {version})")
        if ledger is not None:
            print(_patched_line(ledger, patched, plan))
    if args.profile:
        print(f"profile: {args.profile}" + ("" if args.tree else f" (gates read vLLM {version}, the pin)"))
    if rows:
        print(render_table(rows, with_verdict=with_verdict))
    filters = [f"with verdict {args.verdict}" if args.verdict else "", f"of kind {args.kind}" if args.kind else ""]
    print(summary(rows, with_verdict) if rows else " ".join(["0 patch(es)", *filter(None, filters)]))
    return EXIT_OK


def _sndr_state(tree):
    """(reader, ledger, files holding their patched bytes) of a tree; on a tree sndr patched the
    reader is the tree's :class:`sndr.treeview.PristineView` (the pristine copies in ``.sndr/objects``,
    as apply and verify read them), so sndr's own replacements and markers never read as an upstream merge."""
    root = getattr(tree, "root", None)
    if root is None or not (Path(root) / STATE_DIR).is_dir():
        return tree.read_text, None, set()
    from .commit import TreeRoot, sha256_bytes

    troot = TreeRoot(root)
    ledger = troot.read_ledger()
    if ledger is None:
        return tree.read_text, None, set()
    patched = set()
    for rel, entry in ledger.files.items():
        now = troot.read_bytes(rel)
        if now is not None and sha256_bytes(now) == entry.patched_sha256:
            patched.add(rel)
    if ledger.vllm_version and ledger.vllm_version != getattr(tree, "version", ledger.vllm_version):
        # Another vLLM is installed now (apply's ledger_stale): a file whose bytes are the ones the new
        # version's installer recorded is that version's pristine (upstream merged the change), read as is.
        patched -= set(troot.reinstalled(sorted(patched)))
    # A file that no longer holds the patched bytes is read as it is now.
    return troot.pristine(ledger, base=tree, only=patched).read_text, ledger, patched


def _as_held(plan, ledger, patched: set[str]) -> None:
    """A plan on the pristine copies, read as the tree holds it: an edit of a patch the ledger
    records, in a file that holds its patched bytes, that ``applies`` is ``applied``; so is a runtime
    binding of such a patch (it has no bytes on disk: the ledger's record is what says it is applied), unless
    the ledger was written for another vLLM version (an upgrade in place: apply plans again, ``ledger_stale``)."""
    from .model import Verdict

    current = ledger.vllm_version in ("", plan.version)
    for p in plan.patches:
        if p.id not in ledger.patches:
            continue
        for e in p.edits:
            if e.verdict == Verdict.APPLIES and (e.file in patched or (e.binding and current)):
                e.verdict = Verdict.APPLIED
        if p.status == "applies" and all(e.verdict != Verdict.APPLIES for e in p.edits):
            p.status = "applied"


def _patched_line(ledger, patched: set[str], plan) -> str:
    written = {rel for rel, e in ledger.files.items() if not e.read_only}
    reads = set(ledger.files) - written
    line = (f"patched by sndr: enabled set {ledger.patch_set_digest[:12]} (ledger: {len(ledger.patches)} patch(es), "
            f"{len(written)} file(s) written" + (f", {len(reads)} read" if reads else "") +
            "); verdicts read on the pristine copies in .sndr/objects")
    stale = sorted(written - patched)
    if stale:
        line += f"; {len(stale)} file(s) no longer hold the patched bytes: {', '.join(stale)}"
    changed = sorted(reads - patched)
    if changed:
        line += f"; {len(changed)} file(s) the set read changed since apply (read as they are now): {', '.join(changed)}"
    if plan is not None and plan.digest != ledger.patch_set_digest:
        line += f"; this patch set's enabled set is {plan.digest[:12]}, not the ledger's"
    return line
