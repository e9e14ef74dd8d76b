"""vLLM startup integration: the general-plugin entry point, ``sndr status`` and ``sndr hook``.

``register()`` is the ``vllm.general_plugins`` entry point (``sndr =
sndr.startup.hook:register``). vLLM calls it once in every process it starts (API
server, engine core, workers; fork or spawn). On each call it

1. checks the text patches: on a tree patched on disk, the sha256 of every file
   the ledger names (never a rewrite: a serving process must not patch); in
   in-memory mode, what the import hook served;
2. applies the runtime patches (:mod:`sndr.startup.runtime`), deferring those whose
   module is not imported yet;
3. writes an attestation record (:mod:`sndr.startup.attest`).

It is idempotent and never raises into vLLM, except under ``SNDR_STRICT=1``
(recommended in production), where a required patch that is not active aborts
startup with a message naming it. A forked child (vLLM does not call plugins
again after fork) gets its own record through ``os.register_at_fork``.

The warm path imports no pydantic and no planner: the patch set is resolved
once and memoised in the owner-checked cache (:mod:`sndr.startup.resolve`).

``sndr status`` is parsed here; what it computes (the records checked against
each other and the trees) and prints is :mod:`sndr.startup.status`.
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from typing import Any

from .. import env as envmod
from .. import state as statemod
from ..fsio import UnsafeDirError
from . import importer
from .common import describe, log, read_bytes, sha256
from .hookcache import atomic_write, open_cache
from .resolve import resolve_set, tree_identity

PTH_NAME = "_sndr_hook.pth"
PTH_TEXT = ("# sndr in-memory import hook; `python -m sndr hook uninstall` removes this file.\n"
            "import sndr._boot\n")

_STATE: _Process | None = None
_LOCK = _thread.RLock()
_AT_FORK = False


def _sha_file(path: str) -> str | None:
    data = read_bytes(path)
    return None if data is None else sha256(data)


# ----------------------------------------------------------------------------- per-process state


class _Process:
    def __init__(self, strict: bool):
        self.pid = os.getpid()
        self.ppid = os.getppid()
        self.start = time.time()
        self.start_ns = time.time_ns()
        self.strict = strict
        self.mode = "none"
        self.root: str | None = None
        self.version = ""
        self.digest = ""
        self.ledger_digest: str | None = None
        self.enabled: list[str] = []
        self.gated: list[str] = []
        self.gate_reasons: dict[str, str] = {}
        self.profile: dict = {}
        self.text_counts: dict[str, int] = {}
        self.text: dict = {}
        self.missing: list[str] = []
        self.problems: list[str] = []
        self.patcher: Any = None  # a RuntimePatcher once register() ran
        self.record_path: str | None = None
        self.register_ms = 0.0
        self.role, self.process_name = "", ""
        self.forked_from: int | None = None
        self.ready = False
        self.failed_message = ""
        self.finder: Any = None  # the in-memory hook's SndrFinder, in memory mode
        self.foreign: list[str] = []  # files changed since apply by someone else (not back to pristine)
        # disk mode: sha256 (None: missing) of every file the ledger names, as this process saw it at
        # register(); `sndr status` compares them with the tree as it is now (a re-apply under a live process)
        self.files: dict[str, str | None] = {}
        #: (st_dev, st_ino, st_mtime_ns) of the ledger file it verified: every commit replaces the file, so a
        #: revert and a re-apply of the same set since this process started still show (``sndr status``)
        self.ledger_id: list[int] | None = None
        self.canary: dict[str, dict] = {}  # plugin -> its worst canary verdict here (sndr.kernels.canary)
        self.not_called = ""  # the finding when vLLM loaded its plugins here without sndr's (sndr.startup.plugincheck)

    def forked(self) -> _Process:
        child = _Process.__new__(_Process)
        child.__dict__.update(self.__dict__)
        child.pid, child.ppid = os.getpid(), os.getppid()
        child.start, child.start_ns = time.time(), time.time_ns()
        child.forked_from = self.pid
        child.role, child.process_name = "forked", ""
        child.missing, child.problems = list(self.missing), list(self.problems)
        child.canary = {}  # the child's CUDA context runs its own canaries
        if self.record_path:
            child.record_path = os.path.join(os.path.dirname(self.record_path), f"{child.pid}-{child.start_ns}.json")
        return child

    def runtime_missing(self) -> list[str]:
        if self.patcher is None:
            return []
        return [f"{o.key}: runtime {o.verdict}: {o.reason}" for o in self.patcher.missing_required()]

    def record(self) -> dict:
        from .attest import FORMAT

        runtime: list[dict[str, Any]] = ([o.to_json() for o in self.patcher.outcomes.values()]
                                         if self.patcher is not None else [])
        rt_counts: dict[str, int] = {}
        for o in runtime:
            rt_counts[o["verdict"]] = rt_counts.get(o["verdict"], 0) + 1
        counts = dict(self.text_counts)
        for k, v in rt_counts.items():
            counts["runtime_" + k] = v
        if self.mode == "memory" and self.finder is not None:
            self.text = self.finder.text_state()  # modules are served after register() ran
            reads = (self.finder.plan or {}).get("reads")
            if isinstance(reads, dict):  # the bytes the in-memory plan was made from: status re-hashes them
                self.files = {str(rel): sha if isinstance(sha, str) else None for rel, sha in reads.items()}
        role, name = self.role, self.process_name
        if not self.forked_from:
            from .attest import process_role

            role, name = process_role()
        return {"format": FORMAT, "pid": self.pid, "ppid": self.ppid, "role": role, "process_name": name,
                "forked_from": self.forked_from, "start": self.start, "updated": time.time(),
                "argv": [str(a) for a in sys.argv[:4]], "python": sys.executable,
                "mode": self.mode, "tree": self.root, "vllm_version": self.version,
                "patch_set_digest": self.digest, "ledger_digest": self.ledger_digest, "enabled": self.enabled,
                "gated": self.gated, "gate_reasons": self.gate_reasons, "profile": self.profile,
                "counts": dict(sorted(counts.items())), "text": self.text, "files": self.files, "runtime": runtime,
                "missing_required": self.missing + self.runtime_missing(), "problems": self.problems,
                "strict": self.strict, "register_ms": round(self.register_ms, 3), "canary": dict(self.canary),
                "proc_start": statemod.proc_start_ticks(self.pid), "ledger_id": self.ledger_id}

    def write(self) -> None:
        if not self.ready:
            return
        from .attest import write_record
        from .metrics import publish

        record = self.record()
        publish(record)  # vLLM's /metrics; never raises, costs nothing without prometheus_client
        if not self.record_path:
            return
        try:
            write_record(self.record_path, record)
        except UnsafeDirError as exc:
            log(f"attestation {exc}; this process is NOT attested", once_key="attest-unsafe")
        except OSError as exc:
            log(f"cannot write the attestation {self.record_path}: {exc}", once_key="attest-oserror")


_CANARY_RANK = {"canary_passed": 0, "canary_skipped": 1, "canary_failed": 2}


def note_canary(entry: dict) -> None:
    """A plugin's canary verdict (:mod:`sndr.kernels.canary`) joins this process's attestation.

    Per plugin the worst verdict is kept (failed over skipped over passed); the
    record is rewritten and the gauges republished. A process where
    ``register()`` did not run (a benchmark, a test) has nothing to attest.
    """
    with _LOCK:
        state = _STATE
        if state is None or state.pid != os.getpid():
            return
        plugin = str(entry.get("plugin"))
        old = state.canary.get(plugin)
        if old is not None and _CANARY_RANK.get(old.get("status", ""), 0) > _CANARY_RANK.get(entry.get("status", ""), 0):
            return
        state.canary[plugin] = dict(entry)
        state.write()


def _on_change() -> None:
    state = _STATE
    if state is not None and state.pid == os.getpid():
        state.write()


def _after_fork_in_child() -> None:
    global _STATE
    try:
        state = _STATE
        if state is not None and state.ready:
            _STATE = state.forked()
            _STATE.write()
    except Exception:  # noqa: BLE001 - never break a fork
        pass


# ----------------------------------------------------------------------------- register


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; never raises unless ``SNDR_STRICT=1``."""
    _register("")


def attest_without_plugin(finding: str) -> None:
    """vLLM loaded its plugins here without calling :func:`register` (:mod:`sndr.startup.plugincheck`): attest as it
    would, with ``finding`` and no runtime patch installed. No-op where a record stands; raises only under strict."""
    _register(finding)


def _register(not_called: str) -> None:
    global _STATE, _AT_FORK
    with _LOCK:
        old = _STATE
        if old is not None and old.pid != os.getpid():  # forked without the at-fork hook (os.fork in C code)
            _after_fork_in_child()
            old = _STATE
        if old is not None and (not_called or not old.not_called):  # a register() replaces a not-called record
            if old.strict and old.failed_message:
                raise _strict_error(old.failed_message)
            return
        environ = os.environ
        strict = envmod.strict_mode(environ)
        t0 = time.perf_counter()
        state = _Process(strict)
        state.not_called = not_called
        state.problems.extend([not_called] if not_called else [])
        _STATE = state
        if old is not None and old.record_path:  # one record per process
            try:
                os.unlink(old.record_path)
            except OSError:
                pass
        try:
            _startup(state, environ)
        except Exception as exc:  # noqa: BLE001 - the boundary: vLLM must keep running unless strict
            from .runtime import StrictError

            if isinstance(exc, StrictError):
                state.failed_message = str(exc)
            else:
                state.problems.append(f"internal error in register(): {describe(exc)}")
                state.missing.append(f"sndr: register() failed ({describe(exc)})")
                log(f"register() failed: {describe(exc)}; vLLM runs without sndr's checks",
                    once_key="register-internal")
        state.register_ms = (time.perf_counter() - t0) * 1000
        state.ready = True
        state.write()
        if not _AT_FORK and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _AT_FORK = True
        missing = state.missing + state.runtime_missing()
        if missing and not state.failed_message:
            msg = (f"{len(missing)} required patch(es) NOT active in this process (pid {state.pid}, "
                   f"{state.mode} mode):\n  " + "\n  ".join(missing) + "\n  "
                   + (state.not_called or fix_hint(state.mode, state.foreign)))
            if strict:
                state.failed_message = "sndr: " + msg + "\nSNDR_STRICT=1: refusing to start vLLM"
            else:
                log(msg + "\n  (set SNDR_STRICT=1 to make this fatal)", once_key="missing")
        for p in state.problems:
            if p != state.not_called or not missing:  # else the message above ends with it
                log(p, once_key="problem:" + p)
        if state.patcher is not None:
            state.patcher.strict = strict  # deferred failures at import time now abort under strict
        if strict and state.failed_message:
            raise _strict_error(state.failed_message)


def fix_hint(mode: str, foreign: list[str] | tuple[str, ...] = ()) -> str:
    """The one line that says how to make missing text patches active again (the startup warning).

    ``foreign``: files changed since apply by someone else (not back to pristine); apply refuses
    those (``modified_since_apply``), so the hint says to inspect them, then ``--force`` or revert."""
    if mode == "disk" and foreign:
        return (f"fix: {', '.join(foreign)} changed since apply by someone else: inspect the change, then run "
                "`python -m sndr.apply --force` (it takes the current bytes as pristine and patches them) or "
                "put the file back (reinstall vLLM or restore it) and run `python -m sndr.apply`; then restart vLLM")
    if mode == "disk":
        return ("fix: run `python -m sndr.apply` (it patches again files a reinstall or a restore put back), "
                "then restart vLLM")
    return ("fix: run `python -m sndr.apply` to patch the tree on disk, or on a read-only image "
            "`python -m sndr hook install` (the in-memory hook); then restart vLLM")


def _strict_error(message: str):
    from .runtime import StrictError

    return StrictError(message)


def _tree_root(environ) -> str | None:
    if environ.get(envmod.TREE):
        return os.path.abspath(environ[envmod.TREE])
    vllm = sys.modules.get("vllm")
    path = list(getattr(vllm, "__path__", None) or [])
    if path:
        return os.path.dirname(os.path.abspath(path[0]))
    from importlib.util import find_spec

    try:
        spec = find_spec("vllm")  # top-level: locates, does not import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))
    return None


def _read_ledger(root: str, state: _Process) -> dict | None:
    """The tree's ledger when :func:`sndr.state.read_ledger` finds it ok; a corrupt one (a wrong checksum,
    a symlink, a FIFO, ...) is a problem naming its code, and no text patch can be verified."""
    found = statemod.read_ledger(root)
    if found.kind == "corrupt":
        state.problems.append(f"{found.line()}; text patches cannot be verified")
        state.missing.append(f"ledger: {found.why} ({found.code}), no text patch can be verified")
    return found.ledger


def _startup(state: _Process, environ) -> None:
    boot = sys.modules.get("sndr._boot")
    if boot is not None and getattr(boot, "BOOT_ERROR", None):
        state.problems.append(f"the in-memory hook failed at interpreter start: {boot.BOOT_ERROR}")
        state.missing.append(f"in-memory hook: failed at interpreter start ({boot.BOOT_ERROR})")
    root = _tree_root(environ)
    state.root = root
    if root is None or not os.path.isdir(os.path.join(root, "vllm")):
        state.missing.append("tree: vllm is not importable here; nothing can be verified")
        return
    cache = open_cache(environ)
    profile = _use_process_profile(state, environ)
    state.record_path = _record_path(state, root, environ)
    finder = importer.active_finder()
    ledger = _read_ledger(root, state)
    resolved = None
    if ledger is not None:
        state.mode = "disk"
        state.version = ledger.get("vllm_version", "")
        resolved = resolve_set(state.version, tree_identity(root), environ, cache)
        _check_disk(state, root, ledger, resolved)
    elif finder is not None and finder.memory:
        if not finder.activated and "vllm" in sys.modules:
            importer.install(memory=True, environ=environ)
        ts = finder.text_state()
        state.text = ts
        if ts["active"]:
            state.mode = "memory"
            state.finder = finder
            finder.on_serve = _on_change
            plan = finder.plan
            assert plan is not None  # text_state() is active only with a plan
            resolved = plan["resolved"]
            state.version = plan["version"]
            _check_memory(state, finder, resolved)
    if resolved is None:
        from ..tree import open_tree

        state.version = open_tree(root).version
        resolved = resolve_set(state.version, tree_identity(root), environ, cache)
        text_ids = [pid for pid in resolved["enabled"] if resolved["patches"][pid]["files"]]
        why = "no ledger (not applied on disk) and no in-memory hook"
        if finder is not None and finder.memory and finder.inert_reason:
            why = f"the in-memory hook is inert: {finder.inert_reason}"
        elif finder is not None and finder.memory and finder.problems:
            why = f"the in-memory hook failed: {finder.problems[0]}"
        elif os.path.exists(os.path.join(root, PTH_NAME)) and (finder is None or not finder.memory):
            why = f"{PTH_NAME} is installed but the hook is not active in this process (python -S? installed after start?)"
        state.missing.extend(f"{pid}: text patch not active ({why})" for pid in text_ids)
    state.enabled = list(resolved["enabled"])
    state.problems.extend(resolved.get("unknown_enable") or [])  # SNDR_ENABLE_<id> naming no patch: said, once
    state.gated = list(resolved.get("gated", []))
    state.gate_reasons = dict(resolved.get("gate_reasons", {}))
    state.profile = profile.to_json()  # after gating: the keys a `when` needed are resolved (or their reason)
    state.problems.extend(f"deployment profile: {c}" for c in profile.conflicts)
    state.digest = resolved["digest"]
    _apply_runtime(state, root, resolved, cache, finder)


def _use_process_profile(state: _Process, environ):
    """What `when` tables are evaluated against in this process (sndr.profile.process_profile)."""
    from .. import profile as profmod
    from ..errors import SndrError

    try:
        prof = profmod.process_profile(environ)
    except SndrError as exc:
        why = "; ".join(p.render() for p in exc.problems)
        state.problems.append(f"SNDR_PROFILE is unusable, every `when` key is unknown: {why}")
        prof = profmod.Profile(missing=f"SNDR_PROFILE is unusable ({why})")
    profmod.use_process_profile(prof)
    return prof


def _record_path(state: _Process, root: str, environ) -> str | None:
    from .attest import record_path, run_dir

    return record_path(run_dir(root, environ), state.pid, state.start_ns)


def _check_disk(state: _Process, root: str, ledger: dict, resolved: dict) -> None:
    state.ledger_digest = ledger.get("patch_set_digest")
    state.ledger_id = statemod.ledger_identity(root)
    if os.path.exists(statemod.state_path(root, statemod.JOURNAL)):
        state.problems.append("an interrupted commit is pending on this tree (journal.json); files may be torn")
    bad: dict[str, list[str]] = {}
    for rel, entry in sorted(ledger["files"].items()):
        now = _sha_file(os.path.join(root, rel))
        state.files[rel] = now
        if now != entry.get("patched_sha256"):
            bad[rel] = list(entry.get("patches", []))
            created = bool(entry.get("created"))
            if statemod.read_only_entry(entry):
                why = "read by the set, written by none of its patches, and changed since apply: the verdicts there " \
                      "(merged, optional absent, a runtime target) may no longer hold (read_changed)"
                state.foreign.append(rel)
            elif (now is None and created) or (now is not None and not created and now == entry.get("pristine_sha256")):
                why = "back to pristine: a reinstall or a restore put it back"
            else:
                why = "changed by someone else since apply"
                state.foreign.append(rel)
            state.problems.append(f"{rel}: does not hold the patched bytes the ledger records ({why})")
    on_disk = set(ledger.get("patches", []))
    results = ledger.get("results", {})
    left_out = ledger.get("left_out") or {}
    for pid in resolved["enabled"]:
        if not resolved["patches"][pid]["files"]:
            continue
        if pid not in on_disk and isinstance(left_out.get(pid), dict):
            lo = left_out[pid]
            line = f"{pid}: left out at apply ({lo.get('by')}): {lo.get('reason')}"
            # on_failure = "skip": the patch may be absent; "fail" (left out by --keep-going): a required patch.
            (state.problems if lo.get("on_failure") == "skip" else state.missing).append(line)
        elif pid not in on_disk:
            state.missing.append(f"{pid}: enabled in this process but not applied to the tree "
                                 f"(ledger patch set {str(state.ledger_digest)[:12]})")
        elif results.get(pid) != "merged":
            touched = sorted(rel for rel, ids in bad.items() if pid in ids)
            if touched:
                state.missing.append(f"{pid}: {', '.join(touched)} changed since apply")
    if state.ledger_digest != resolved["digest"]:
        extra = sorted(on_disk - set(resolved["enabled"]))
        state.problems.append(f"this process enables patch set {resolved['digest'][:12]} but the tree was patched "
                              f"with {str(state.ledger_digest)[:12]}"
                              + (f" (on disk, not enabled here: {', '.join(extra)})" if extra else ""))
    state.text_counts = dict(ledger.get("counts", {}))
    state.text = {"verified_files": len(ledger["files"]) - len(bad), "changed_files": sorted(bad)}


def _check_memory(state: _Process, finder, resolved: dict) -> None:
    plan = finder.plan
    ts = state.text
    state.text_counts = dict(plan.get("counts", {}))
    if plan["problems"]:
        for pid in resolved["enabled"]:
            if resolved["patches"][pid]["files"]:
                state.missing.append(f"{pid}: the patch set does not apply in memory ({plan['problems'][0]})")
        return
    by_module = {e["module"]: e for e in plan["served"].values()}
    for m in ts["preimported"] + ts["bypassed"]:
        for pid in by_module[m]["patches"]:
            state.missing.append(f"{pid}: {m} was imported without the hook; it runs pristine code")


def _apply_runtime(state: _Process, root: str, resolved: dict, cache, finder) -> None:
    from ..packs import module_allowed
    from .runtime import RuntimePatcher

    for pid, info in resolved["patches"].items():
        module = info.get("module")
        if module and not module_allowed(module, *info.get("allowed", [])):
            state.missing.append(f"{pid}: plugin module {module} is outside sndr and the patch's pack: refused")

    if state.not_called:  # vLLM did not call register(): no runtime patch is installed, and the record says so
        from .plugincheck import inactive

        inactive(state, resolved)
        return
    patcher = RuntimePatcher(strict=False, memo=cache, on_change=_on_change)
    state.patcher = patcher
    if resolved["runtime"]:
        patcher.apply(resolved["runtime"])


# ----------------------------------------------------------------------------- sndr status


def run_status(args) -> int:
    """``sndr status`` (its options: :mod:`sndr.commands.status`): the verdict over the attestation records,
    computed and rendered by :mod:`sndr.startup.status`."""
    from ..cli import write_output
    from . import status

    directory = status.run_dir_for(args.run_dir, args.tree)  # a bad --tree: SndrError, rendered by cli.run
    from ..errors import bad_input

    # Every refusal below is a SndrError (or an OSError) for the command boundary (cli.run): one line on stderr,
    # exit 2, and under --json - one JSON document on stdout.
    try:
        st = status.read_status(directory, live=args.live, prune=args.prune,
                                tree=status.tree_filter(args.run_dir, args.tree))
    except UnsafeDirError as exc:
        if args.prometheus and args.prometheus != "-":  # never leave an earlier run's sndr_status_ok 1 there
            from contextlib import suppress

            from .metrics import write_textfile

            with suppress(Exception):
                write_textfile(args.prometheus, [], [f"{exc.message}; its records cannot be trusted"])
        raise bad_input(exc.code, f"{exc.message}; its records cannot be trusted", file=exc.path) from None
    if args.prometheus:
        from .metrics import write_textfile

        try:
            write_textfile(args.prometheus, st.live(), st.findings)
        except ImportError:
            raise bad_input("extra_missing", "--prometheus needs prometheus_client", key="--prometheus",
                            hint="pip install prometheus-client") from None
    if args.json:
        write_output(args.json, status.render_json(st) + "\n", "--json")
    if args.json != "-":  # --json - : stdout holds the JSON document only; --prometheus - : the gauges only
        print(status.render_text(st), file=sys.stderr if args.prometheus == "-" else sys.stdout)
    return 0 if st.ok else 1


# ----------------------------------------------------------------------------- sndr hook install|uninstall


def run_hook(action: str, site: str | None, python: str | None) -> int:
    """``sndr hook install|uninstall`` (its options: :mod:`sndr.commands.hook`): write or remove the .pth.

    Bad input raises :class:`sndr.errors.SndrError` and an OS error stays one; the command's boundary
    (:func:`sndr.cli.run`) renders both, and shows the traceback of anything else (exit 3)."""
    if site is None:
        from ..errors import SndrError
        from ..tree import find_installed_root

        try:
            site = str(find_installed_root(python))
        except SndrError as exc:  # its hint names --tree, an option of the tree commands; hook's are these
            import dataclasses

            hint = "pass --python, the interpreter of the vLLM environment, or --site, its site-packages directory"
            raise SndrError([dataclasses.replace(p, hint=hint) if p.code == "vllm_not_found" else p
                             for p in exc.problems], exc.exit_code) from None
    from ..errors import bad_input

    site = os.path.abspath(site)
    if not os.path.isdir(site):
        raise bad_input("site_not_a_dir", "--site is not a directory", file=site, key="--site",
                        hint="pass the site-packages directory of the vLLM environment")
    path = os.path.join(site, PTH_NAME)
    from ..cli import check_output

    check_output(path, "the hook's .pth")  # a symlink, FIFO or directory there: refused, never replaced
    if action == "uninstall":
        if os.path.exists(path):
            os.unlink(path)
            print(f"removed {path}")
        else:
            print(f"no hook installed in {site}")
        return 0
    if python and not _python_sees_sndr(python):
        raise bad_input("sndr_not_importable", f"{python} cannot import sndr: the .pth would import nothing",
                        key="--python", hint="install sndr into that environment first (pip install sndr)")
    atomic_write(path, PTH_TEXT.encode(), mode=0o644)
    print(f"installed {path}")
    if not _site_has_sndr(site):
        print(f"note: {site} holds no sndr package: every interpreter of that environment imports sndr at start "
              "through this .pth; install sndr there (pip install sndr), or they print an import error and run "
              "vLLM unpatched, which SNDR_STRICT=1 cannot stop", file=sys.stderr)
    if os.path.exists(statemod.state_path(site, statemod.LEDGER)):
        print(f"note: {site} is patched on disk (it has a ledger); the hook stays inert there")
    return 0


def _site_has_sndr(site: str) -> bool:
    """Does ``site`` hold sndr: the package, its dist-info, or an editable install's finder/.pth?"""
    try:
        names = os.listdir(site)
    except OSError:
        return False
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this sndr's package directory
    return os.path.dirname(here) == os.path.abspath(site) or any(
        n == "sndr" or (n.lower().startswith("sndr-") and n.endswith((".dist-info", ".egg-info", ".egg-link")))
        or (n.startswith("__editable__") and "sndr" in n.lower()) for n in names)


def _python_sees_sndr(python: str) -> bool:
    import subprocess

    proc = subprocess.run([python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('sndr') is None)"],
                          capture_output=True, cwd="/")
    return proc.returncode == 0
