"""What ``sndr status`` computes: the attestation records of a run directory, checked against each other
and against the trees as they are now, and their rendering.

:func:`read_status` reads every record (:func:`sndr.startup.attest.read_records`
validates each), marks which processes are alive, and gathers the findings:
processes that disagree on the patch set, a missing required patch, an enabled
set other than the one the tree was patched with, tree files changed since they
were patched (:func:`recheck_trees`), and live processes whose tree no longer
holds what they attested (:func:`attested_vs_tree`). :func:`render_text` and
:func:`render_json` print it. The command line (``python -m sndr status``) is a
thin caller in :mod:`sndr.startup.hook`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import env as envmod
from .. import state as statemod
from .common import sha256
from .hookcache import secure_dir


@dataclass
class Status:
    """The records of one run directory and what is wrong with them (no finding: ok)."""

    directory: str
    records: list[dict] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def live(self) -> list[dict]:
        return [r for r in self.records if r["_alive"]]


def run_dir_for(run_dir: str | None, tree: str | None) -> str:
    """The attestation directory: ``run_dir``, else ``$SNDR_RUN_DIR``, else the default for ``tree`` (default:
    where ``import vllm`` finds it). Raises what finding the tree raises."""
    from .attest import run_dir as default_run_dir

    if run_dir:
        return os.path.abspath(run_dir)
    if os.environ.get(envmod.RUN_DIR):
        return default_run_dir(None)
    return default_run_dir(str(_tree_root(tree)))


def _tree_root(tree: str | None) -> Path:
    """The directory holding ``vllm/`` whose processes' records ``status`` reads: the one the hook keys them
    by (:func:`sndr.startup.attest.tree_key`). ``tree`` is a directory (``vllm/`` itself means its parent,
    :func:`sndr.treespec.vllm_root`) or ``installed[:PYTHON]``; None: where ``import vllm`` finds it. A
    spelling of the same tree never leads to another (empty) run directory, and a path without ``vllm/``
    is an error, not "no attestation records"."""
    from ..errors import bad_input
    from ..tree import directory, find_installed_root
    from ..treespec import parse, vllm_root

    if tree is None:
        return find_installed_root()
    if parse(tree).kind not in ("installed", "path"):
        raise bad_input("bad_tree_spec", f"{tree!r} is not an installed tree: status reads the attestations of "
                        "the vLLM processes that run from one", key="--tree",
                        hint="pass the directory that contains vllm/, or installed:/path/to/python")
    root = directory(tree, dry_run=False)  # tree_not_found, a file, installed:PYTHON's vllm_not_found
    if vllm_root(root) is None:
        raise bad_input("not_a_tree", f"{tree} does not contain a vllm/ package", file=tree, key="--tree",
                        hint="pass the directory that contains vllm/ (site-packages or a checkout)")
    return root


def tree_filter(run_dir: str | None, tree: str | None) -> str | None:
    """The tree whose records alone count, when ``--tree`` names one but the directory read is not keyed by
    it (``--run-dir`` or ``$SNDR_RUN_DIR``, which may hold several trees' processes); else None."""
    if tree is None or not (run_dir or os.environ.get(envmod.RUN_DIR)):
        return None
    return os.path.realpath(_tree_root(tree))


def read_status(directory: str, *, live: bool = False, prune: bool = False, tree: str | None = None,
                environ=None) -> Status:
    """Every record of ``directory`` and the findings. ``prune`` deletes the records of exited processes,
    ``live`` leaves them out; ``tree`` (:func:`tree_filter`) keeps that tree's processes only. ``environ``
    (default: this process's) is checked for a ``VLLM_PLUGINS`` that leaves sndr out: a readiness probe runs in
    the container's environment, and vLLM processes started with it never attest without the import hook.
    Raises :class:`sndr.fsio.UnsafeDirError` when the directory cannot be trusted."""
    from ..state import pid_alive, proc_start_ticks
    from .attest import read_records

    if os.path.isdir(directory):
        secure_dir(directory, "attestation")
    records, bad = read_records(directory, live=live, prune=prune)  # each validated: its pid is a positive int
    if tree is not None:
        records = [r for r in records if r.get("tree") and os.path.realpath(r["tree"]) == tree]
    for r in records:
        # the pid alone is not the process: a recorded start that differs is another process on a reused pid
        started, now = r.get("proc_start"), proc_start_ticks(r["pid"])
        r["_alive"] = pid_alive(r["pid"]) and (not isinstance(started, int) or now is None or now == started)
    if prune:
        for r in records:
            if not r["_alive"]:
                try:
                    os.unlink(r["_path"])
                except OSError:
                    pass
        records = [r for r in records if r["_alive"]]
    if live:
        records = [r for r in records if r["_alive"]]
    findings: list[str] = list(bad)
    from .plugincheck import finding

    excluded = finding(environ)
    if excluded is not None:
        findings.append(f"in the environment sndr status runs in: {excluded}")
    if not records:
        findings.append(f"no attestation records in {directory}" + (f" of processes of {tree}" if tree else "")
                        + ": no process proved its patch set (a vLLM process whose VLLM_PLUGINS leaves out sndr "
                          "attests only where sndr's import hook is installed: check its environment)")
    digests = sorted({r.get("patch_set_digest") or "" for r in records})
    if len(digests) > 1:
        # which processes hold which set, and the patches that make the difference (not two digests only)
        who = {d: [str(r["pid"]) for r in records if (r.get("patch_set_digest") or "") == d] for d in digests}
        sets = [set(r.get("enabled") or []) for r in records]
        differ = sorted(set.union(*sets) - set.intersection(*sets))
        findings.append("processes disagree on the patch set: "
                        + ", ".join(f"{d[:12] or '(none)'} (pid {', '.join(who[d])})" for d in digests)
                        + (f"; enabled in some, not all: {', '.join(differ)}" if differ else
                           "; the same patch ids, other contents or settings"))
    for r in records:
        for m in r.get("missing_required") or []:
            findings.append(f"pid {r['pid']} ({r.get('role')}): missing {m}")
        for pr in r.get("problems") or []:  # what the process itself found at startup (a bad SNDR_ENABLE_*, ...)
            findings.append(f"pid {r['pid']} ({r.get('role')}): {pr}")
        ledger, own = r.get("ledger_digest"), r.get("patch_set_digest")
        if r.get("mode") == "disk" and ledger and own and ledger != own:
            # The process resolved another enabled set (its SNDR_ENABLE_*/profile) than the one on disk:
            # apply --verify fails on such a tree, so status must not say ok either.
            findings.append(f"pid {r['pid']} ({r.get('role')}): enables patch set {own[:12]} but the tree was "
                            f"patched with {ledger[:12]}; give the process the environment apply ran with, "
                            f"or re-run python -m sndr.apply with the process's settings")
    findings.extend(recheck_trees(records))
    findings.extend(attested_vs_tree([r for r in records if r["_alive"]]))
    return Status(directory, records, findings)


def render_json(st: Status) -> str:
    out = {"run_dir": st.directory, "ok": st.ok, "findings": st.findings,
           "processes": [{k: v for k, v in r.items() if k != "_path"} for r in st.records]}
    return json.dumps(out, indent=2, sort_keys=True)


def render_text(st: Status) -> str:
    """One line per process (its gated patches and failed canaries under it), the findings, the verdict."""
    lines = [f"sndr status: {st.directory}"]
    for r in st.records:
        lines.append(status_line(r))
        for pid, why in sorted((r.get("gate_reasons") or {}).items()):
            if why.startswith("when_"):
                lines.append(f"      {pid} gated: {why}")
        for line in canary_lines(r):
            lines.append(f"      {line}")
    for f in st.findings:
        lines.append(f"  FINDING {f}")
    lines.append("ok" if st.ok else f"FAILED: {len(st.findings)} finding(s)")
    return "\n".join(lines)


def canary_lines(r: dict) -> list[str]:
    """``PK0001 canary_failed: why (device)`` for every plugin whose canary did not pass (``sndr status``)."""
    out = []
    for plugin, c in sorted((r.get("canary") or {}).items()):
        if isinstance(c, dict) and c.get("status") != "canary_passed":
            out.append(f"{plugin} {c.get('status')}: {c.get('why')} ({c.get('device')}); vLLM's path runs instead")
    return out


def status_line(r: dict) -> str:
    """One process: what is active in it, never the ledger's edit counts beside a MISSING patch."""
    alive = "running" if r.get("_alive") else "exited"
    return (f"  pid {r['pid']:>7}  ppid {r.get('ppid', '?'):>7}  {str(r.get('role') or '?'):<12} "
            f"{r.get('mode', '?'):<6}  enabled set {(r.get('patch_set_digest') or '(none)')[:12]:<12}  {alive:<7}  "
            f"{active_summary(r)}")


def active_summary(r: dict) -> str:
    """``active 23/23 patches (applied=64 ...)`` when all is well; else which enabled patches are NOT active."""
    from .attest import missing_patch_id

    enabled = list(r.get("enabled") or [])
    missing = list(r.get("missing_required") or [])
    named = {missing_patch_id(m) for m in missing}
    inactive = [pid for pid in enabled if pid in named]
    active = len(enabled) - len(inactive)
    if not missing:
        counts = " ".join(f"{k}={v}" for k, v in sorted((r.get("counts") or {}).items()))
        return f"ok  active {active}/{len(enabled)} patches" + (f"  ({counts})" if counts else "")
    other = len(missing) - sum(1 for m in missing if missing_patch_id(m) in inactive)
    what = ", ".join(inactive) + (f" (+{other} other)" if other and inactive else f"{other} other" if other else "")
    return f"MISSING {len(missing)}  active {active}/{len(enabled)} patches; NOT active: {what}"


class Unreadable(Exception):
    """A tree file status cannot read as a regular file (a FIFO, a device, a symlink, a permission)."""


def tree_sha(path: str) -> str | None:
    """sha256 of a regular file now (None: it does not exist); never blocks, never follows a link."""
    from ..fsio import FileProblem, read_regular

    try:
        return sha256(read_regular(path, None, "file", follow_symlinks=False))
    except FileProblem as exc:
        if exc.code == "not_found":
            return None
        raise Unreadable(f"{exc.message} ({exc.code})") from None


def tree_ledger(root: str) -> tuple[dict | None, str | None]:
    """(ledger, problem) of ``root`` now, read by :func:`sndr.state.read_ledger`: (None, None) when there is
    no ledger; (None, the line naming it and its code) when it is corrupt."""
    found = statemod.read_ledger(root)
    return found.ledger, (found.line() if found.kind == "corrupt" else None)


def recheck_trees(records: list[dict]) -> list[str]:
    """Files can change after a process attested: hash every on-disk tree's ledger files again."""
    out = []
    for root in sorted({r["tree"] for r in records if r.get("mode") == "disk" and r.get("tree")}):
        ledger, problem = tree_ledger(root)
        if problem is not None:
            out.append(problem)
            continue
        if ledger is None:
            out.append(f"{root}: the ledger is gone (reverted?) since processes attested")
            continue
        for rel, entry in sorted(ledger["files"].items()):
            try:
                now = tree_sha(os.path.join(root, rel))
            except Unreadable as exc:
                out.append(f"{root}/{rel}: cannot be re-hashed: {exc}")
                continue
            if now != entry.get("patched_sha256"):
                what = "changed since apply (read by the set, written by none of its patches: read_changed)" \
                    if statemod.read_only_entry(entry) else "changed since it was patched"
                out.append(f"{root}/{rel}: {what} (tree no longer matches the ledger)")
    return out


def attested_vs_tree(live: list[dict]) -> list[str]:
    """Each live on-disk process against the tree as it is now: the enabled set it attested (its
    digest) and the sha256 of every file it verified at startup.

    A re-apply with another set under a running process leaves a tree that matches its
    *new* ledger, so re-hashing against the ledger says nothing; but every module that
    process imports from now on is not what it attested. Only a restart makes it right.
    """
    out = []
    ledgers: dict[str, tuple[dict | None, str | None]] = {}
    shas: dict[str, str | None | Unreadable] = {}
    for r in live:
        root = r.get("tree")
        if r.get("mode") == "memory" and root and r.get("files"):
            # in-memory: the files its plan was made from; one changed since means the modules it serves
            # from now on (and any process started later) differ from what it attested
            changed = []
            for rel, sha in sorted(r["files"].items()):
                try:
                    held: str | None = tree_sha(os.path.join(root, rel))
                except Unreadable:
                    held = "unreadable"
                if held != sha:
                    changed.append(rel)
            if changed:
                out.append(f"pid {r['pid']} ({r.get('role')}): {len(changed)} file(s) its in-memory patches were "
                           f"planned from changed since it attested: {', '.join(changed)}; restart it")
            continue
        if r.get("mode") != "disk" or not root:
            continue
        who = f"pid {r['pid']} ({r.get('role')})"
        if root not in ledgers:
            ledgers[root] = tree_ledger(root)
        ledger, problem = ledgers[root]
        if problem is not None:
            continue  # recheck_trees names it
        own = r.get("patch_set_digest") or ""
        now_digest = (ledger or {}).get("patch_set_digest")
        why = []
        if ledger is None:
            why.append("the tree has no ledger any more (reverted?)")
        elif now_digest != r.get("ledger_digest"):
            # (the same ledger as at startup but another set than its own is read_status's finding)
            why.append(f"the tree was re-applied since it attested: it runs enabled set {own[:12]}, the tree "
                       f"held ledger {str(r.get('ledger_digest'))[:12]} then and holds {str(now_digest)[:12]} now")
        attested = r["files"]
        differ = []
        for rel in sorted(set(attested) | set((ledger or {}).get("files", {}))):
            path = os.path.join(root, rel)
            if path not in shas:
                try:
                    shas[path] = tree_sha(path)
                except Unreadable as exc:
                    shas[path] = exc
            now = shas[path]
            if rel not in attested or isinstance(now, Unreadable) or now != attested[rel]:
                differ.append(rel)
        if differ:
            why.append(f"{len(differ)} file(s) do not hold the bytes it attested: {', '.join(differ)}")
        attested_id = r.get("ledger_id")
        if not why and isinstance(attested_id, list) and statemod.ledger_identity(root) != attested_id:
            # the same set and the same bytes again, but written by a later commit: between the two (a revert,
            # then a re-apply) the process may have imported pristine modules, and it would still look right
            why.append("the ledger was rewritten by a commit since it attested (a revert and a re-apply, or "
                       "another apply), so a module it imported in between may be another version of the file")
        if why:
            out.append(f"{who}: the tree no longer holds the patch set this process attested: " + "; ".join(why)
                       + "; modules it imports from now on are not the ones it attested: restart it")
    return out
