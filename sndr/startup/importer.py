"""The in-memory import hook, post-import hooks, and the caches behind sndr's startup path.

Three things live here because they share one ``sys.meta_path`` finder:

* **In-memory mode.** ``python -m sndr hook install`` writes a ``.pth`` line that
  imports :mod:`sndr._boot`, which calls :func:`install`. The finder stays
  inert until ``vllm`` itself is imported; then it locates the tree, plans the
  patch set over the pristine on-disk texts (the very planner ``apply`` uses),
  and serves the patched source of each target module. Code is compiled with
  the real filename, so tracebacks and ``inspect`` point at the real file, and
  :mod:`linecache` is primed with the patched lines so they also *show* the
  code that runs. The tree is never written.
* **Post-import hooks** (:meth:`SndrFinder.watch`): run a callback right after
  a module executes, before anyone can ``from mod import name``. Runtime
  patches use them to patch a module when it is imported.
* **Caches** under ``<cache>/hook``: compiled code keyed by sha256 of the
  exact patched source + patch-set digest + Python version + filename; patched
  sources keyed by their sha256; and memos of the resolved patch set, so a warm
  start neither imports pydantic nor runs the planner. The directory is walked
  from ``/`` without following symlinks, every directory on its path must be
  owned by root or this uid and not writable by others, and it is then used
  only through held directory fds; every entry carries an HMAC under a 0600
  per-cache secret over its name and bytes. A mismatch is recompiled or
  recomputed, never trusted.

This module is imported at interpreter start by the ``.pth``; its top-level
imports are kept to what the interpreter has already loaded.
"""

from __future__ import annotations

import _thread
import os
import sys
from importlib.machinery import ModuleSpec

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: interpreter start does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable

# ----------------------------------------------------------------------------- logging

_logged: set[str] = set()


def log(msg: str, once_key: str | None = None) -> None:
    """Loud, dependency-free message to stderr (logging may not be configured yet)."""
    if once_key is not None:
        if once_key in _logged:
            return
        _logged.add(once_key)
    try:
        sys.stderr.write(f"sndr: {msg}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must never break an import
        pass


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _read(path: str) -> bytes | None:
    """A regular file's bytes, or None when it is missing or cannot be one: a FIFO, device or directory
    (refused without blocking: :func:`sndr.fsio.read_regular`), a symlink loop, a name too long, a NUL."""
    fsio = _fsio()
    try:
        return fsio.read_regular(path)
    except (fsio.FileProblem, ValueError):
        return None


# ----------------------------------------------------------------------------- safe directories


def _fsio():
    from .. import fsio  # the rule's one home (stdlib only); imported when first needed

    return fsio


def __getattr__(name: str):
    # ``importer.UnsafeDirError`` is :class:`sndr.fsio.UnsafeDirError` (a directory another user
    # could change), resolved on first use so interpreter start does not import fsio.
    if name == "UnsafeDirError":
        return _fsio().UnsafeDirError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_private(path: str, what: str = "cache"):
    """:class:`sndr.fsio.PrivateDir` of ``path``: walked from ``/`` without following symlinks, every
    ancestor owned by root or this uid and not writable by others, held open by fd."""
    return _fsio().PrivateDir.open(path, what)


def secure_dir(path: str, what: str = "cache") -> str:
    """Create ``path`` with mode 0700 (if missing) and check nobody else can change it or its path.

    A poisoned code cache would run in every vLLM process, and a forged
    attestation would hide an unpatched worker, so both are refused, loudly,
    when the directory is owned by another uid or writable by group/others, or
    when any directory on its path is owned by another uid than root or ours, or
    writable by others without the sticky bit (sshd's ``StrictModes`` rule).
    Returns the resolved path; callers that then read or write inside it use
    :func:`open_private` and its fd instead of the path.
    """
    d = open_private(path, what)
    try:
        return d.path
    finally:
        d.close()


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Random ``O_EXCL | O_NOFOLLOW`` temp file + ``os.replace`` (:func:`sndr.fsio.atomic_write`)."""
    _fsio().atomic_write(path, data, mode, durable=False)


def default_cache_root(environ=None) -> str:
    from .. import env

    return str(env.cache_root(environ))


# ----------------------------------------------------------------------------- the cache


def _py_tag() -> str:
    from importlib.util import MAGIC_NUMBER

    return f"{sys.implementation.cache_tag}-{MAGIC_NUMBER.hex()}"


class HookCache:
    """Compiled code, patched sources and memos under ``<cache root>/hook``.

    Layout (every entry sealed: an HMAC-SHA256 under ``hook/.secret``, a 0600
    file created on first use, over the entry's kind, its name and its bytes)::

        code/<key>           hmac(32) + MAGIC + marshal(code); key = sha256(source sha, digest, Python, filename)
        src/<sha256>.py      hmac(32) + patched source, whose sha256 is its name
        memo/<name>.json     hmac(32) + resolved patch sets, memory plans, bindings, pack discovery

    The directories are reached by a walk from ``/`` that refuses symlinks and
    any directory another uid could change (the cache-root rule,
    :func:`sndr.caches.require_dir`, over :class:`sndr.fsio.PrivateDir`), and
    every read and write goes through their held fds. So an entry is used only
    when this uid wrote it, for exactly this name: a code object is only ever
    the one compiled from the patched source whose sha256 this process computed.
    """

    def __init__(self, root: str):
        from ..caches import require_dir  # the cache-root rule (one decision for every cache)

        hook = require_dir("hook", "code cache", root=root)
        self._hook = hook
        self._code = hook.sub("code", "code cache")
        self._src = hook.sub("src", "code cache")
        self._memo = hook.sub("memo", "code cache")
        self.root = hook.path
        self.code_dir = self._code.path
        self.src_dir = self._src.path
        self.memo_dir = self._memo.path
        # One secret for the whole cache, read through the hook dir's fd.
        secret = hook.secret()
        for d in (self._code, self._src, self._memo):
            d._secret = secret

    # -- compiled code -----------------------------------------------------

    @staticmethod
    def code_key(source_sha256: str, digest: str, filename: str) -> str:
        """sha256 over the exact patched source's hash, the patch-set digest, the Python and the filename."""
        return _sha256("\0".join(("code", _py_tag(), source_sha256, digest, filename)).encode())

    def load_code(self, key: str):
        import marshal
        from importlib.util import MAGIC_NUMBER

        data = self._code.get_sealed("code", key)
        if data is None or data[:len(MAGIC_NUMBER)] != MAGIC_NUMBER:
            return None  # missing, forged, moved, damaged or another Python: recompile, never trust
        try:
            return marshal.loads(data[len(MAGIC_NUMBER):])
        except (EOFError, ValueError, TypeError):
            return None

    def store_code(self, key: str, code) -> None:
        import marshal
        from importlib.util import MAGIC_NUMBER

        try:
            self._code.put_sealed("code", key, MAGIC_NUMBER + marshal.dumps(code))
        except OSError as exc:
            log(f"cannot write the code cache ({exc}); continuing without it", once_key="code-write")

    # -- patched sources ---------------------------------------------------

    def load_source(self, sha: str) -> str | None:
        data = self._src.get_sealed("src", sha + ".py")
        if data is None or _sha256(data) != sha:
            return None
        return data.decode("utf-8")

    def store_source(self, text: str) -> str:
        data = text.encode("utf-8")
        sha = _sha256(data)
        if self.load_source(sha) is None:
            try:
                self._src.put_sealed("src", sha + ".py", data)
            except OSError as exc:
                log(f"cannot write the source cache ({exc}); continuing without it", once_key="src-write")
        return sha

    # -- memos -------------------------------------------------------------

    def load_memo(self, name: str):
        import json

        data = self._memo.get_sealed("memo", name + ".json")
        if data is None:
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("key") != name:
            return None
        return obj

    def store_memo(self, name: str, obj: dict) -> None:
        import json

        obj = dict(obj, key=name)
        try:
            self._memo.put_sealed("memo", name + ".json", json.dumps(obj, sort_keys=True).encode())
        except OSError as exc:
            log(f"cannot write the memo cache ({exc}); continuing without it", once_key="memo-write")


_CACHES: dict[str, HookCache | None] = {}


def open_cache(environ=None) -> HookCache | None:
    """The process's cache, or None (refused loudly) when it is unsafe or cannot be created."""
    root = default_cache_root(environ)
    if root in _CACHES:
        return _CACHES[root]
    cache = None
    try:
        cache = HookCache(root)
    except _fsio().UnsafeDirError as exc:
        log(f"{exc}. The code cache is disabled; sndr compiles in memory instead", once_key="unsafe:" + root)
    except OSError as exc:
        log(f"cannot create the cache under {root} ({exc.strerror}); continuing without it", once_key="nocache:" + root)
    _CACHES[root] = cache
    return cache


# ----------------------------------------------------------------------------- fingerprints


def shipped_patches_dir() -> str:
    from .. import env  # the rule's one home; imported lazily (interpreter start stays cheap)

    return str(env.shipped_patches_dir())


def patches_dir(environ=None) -> str:
    from .. import env

    return str(env.patches_dir(environ))


# The modules whose code decides what a patch set resolves to; a change to any
# of them (an upgrade of sndr) invalidates every memo.
# Paths relative to the sndr package. tests/test_architecture.py checks that each
# exists, so moving a module cannot silently turn memo invalidation off.
# The CLI shell (apply.py, the commands) is not one of them: editing --help text must not send every
# vLLM process down the cold path.
_STAMP_MODULES = ("model.py", "load.py", "plan.py", "profile.py", "classify.py", "binding.py", "packs.py", "env.py",
                  "fsio.py", "locate.py", "state.py", "startup/importer.py", "startup/runtime.py")


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _code_stamp() -> list[tuple[str, int | None, int | None]]:
    root = _package_root()
    out: list[tuple[str, int | None, int | None]] = []
    for name in _STAMP_MODULES:
        try:
            st = os.stat(os.path.join(root, name))
            out.append((name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((name, None, None))
    return out


def _dir_fingerprint(h, directory: str) -> None:
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".toml") and not n.startswith("_"))
    except OSError:
        h.update(b"missing\0" + directory.encode() + b"\0")
        return
    h.update(directory.encode() + b"\0")
    for n in names:
        data = _read(os.path.join(directory, n)) or b""
        h.update(f"{n}\0{len(data)}\0".encode())
        h.update(data)


def set_fingerprint(pdir: str, tree_id: str, environ=None, cache: HookCache | None = None,
                    profile: bool = True) -> str:
    """sha256 of every input that decides the resolved patch set.

    The patch files' bytes (built-in and plugin packs), ``SNDR_ENABLE_*``, ``SNDR_PLUGINS``, the
    tree's identity (which fixes the vLLM version the gates read), the Python
    and sndr's own code. Reading ~100 small files costs about a millisecond.
    """
    import hashlib

    from .. import env

    environ = os.environ if environ is None else environ
    h = hashlib.sha256()
    h.update(repr((_py_tag(), _code_stamp(), tree_id)).encode())
    h.update(repr(sorted((k, v) for k, v in environ.items() if k.startswith(env.ENABLE_PREFIX) or k == env.PLUGINS)).encode())
    if profile:  # only for a set with `when` tables (see memo_key): the profile decides it then
        from .. import profile as _profile

        h.update(_profile.active_fingerprint(environ).encode())
    _dir_fingerprint(h, os.path.abspath(pdir))
    from .. import packs

    for pack in packs.discover_cached(cache):
        h.update(repr((pack["name"], pack["value"], pack.get("version"))).encode())
        for d in pack["dirs"]:
            _dir_fingerprint(h, d)
    return h.hexdigest()


def tree_identity(root: str) -> str:
    """What fixes a tree's vLLM version, cheaply: its dist-info names and version files."""
    try:
        infos = sorted(n for n in os.listdir(root) if n.startswith("vllm-") and n.endswith((".dist-info", ".egg-info")))
    except OSError:
        infos = []
    parts = [os.path.abspath(root), "|".join(infos)]
    for rel in ("vllm/version.py", "vllm/_version.py"):
        data = _read(os.path.join(root, rel))
        parts.append(_sha256(data) if data is not None else "-")
    return "\0".join(parts)


# ----------------------------------------------------------------------------- resolved patch sets


def build_resolved(patch_set, version: str, environ) -> dict:
    """What a process needs of a patch set, as plain JSON: enabled ids, digest, runtime edits.

    The enabled set comes from its one home (:func:`sndr.plan.enabled_set`), so the digest
    a process attests is the digest ``apply`` writes into the ledger.
    """
    from .. import packs
    from ..plan import enabled_set, unknown_enable_vars

    es = enabled_set(patch_set, version, environ)
    on = list(es.ids)
    found_packs = packs.discover()
    patches = {}
    runtime = []
    for pid in on:
        p = patch_set.by_id[pid]
        source = patch_set.source_of(pid)
        pack = packs.pack_of_source(source, found_packs)
        allowed = ["sndr"] + ([pack.module] if pack is not None else [])
        patches[pid] = {"kind": p.kind, "title": p.title, "source": source,
                        "pack": pack.name if pack is not None else None,
                        "files": [f.path for f in p.files], "module": p.module, "allowed": allowed}
        for r in p.runtime:
            runtime.append(dict(r.model_dump(mode="json"), patch=pid, allowed=allowed))
    gated = sorted(p.id for p in patch_set.patches if p.id not in set(on))
    needs_profile = any(p.when for p in patch_set.patches)
    # gate_reasons: why each is gated (when_unknown, ...): sndr status shows it
    return {"format": 1, "version": version, "enabled": on, "gated": gated, "digest": es.digest, "patches": patches,
            "needs_profile": needs_profile, "unknown_enable": unknown_enable_vars(patch_set, environ),
            "runtime": runtime, "gate_reasons": es.reasons()}


def memo_key(prefix: str, pdir: str, tree_id: str, environ, cache: HookCache) -> tuple[str, str]:
    """(key to read, key without the profile) of a memo of the resolved set.

    The deployment profile (``SNDR_PROFILE`` and, in a vLLM process, its own
    command line) decides a set only when a patch has a ``when`` table. So the
    memo is keyed without it, and a set with ``when`` leaves a marker there
    (``needs_profile``) that sends readers to a key with the profile. Keying
    every set on the process's argv would send each spawned worker (its argv
    names fresh pipe fds) down the cold path.
    """
    base = prefix + set_fingerprint(pdir, tree_id, environ, cache, profile=False)
    marker = cache.load_memo(base)
    if marker is not None and marker.get("needs_profile"):
        return prefix + "p-" + set_fingerprint(pdir, tree_id, environ, cache, profile=True), base
    return base, base


def store_keyed(cache: HookCache, prefix: str, base: str, pdir: str, tree_id: str, environ, obj: dict,
                needs_profile: bool) -> None:
    """Store ``obj`` where :func:`memo_key` will find it."""
    if not needs_profile:
        cache.store_memo(base, obj)
        return
    cache.store_memo(base, {"format": 1, "needs_profile": True})
    cache.store_memo(prefix + "p-" + set_fingerprint(pdir, tree_id, environ, cache, profile=True), obj)


def resolve_set(version: str, tree_id: str, environ=None, cache: HookCache | None = None,
                pdir: str | None = None) -> dict:
    """The resolved patch set: from the memo when its fingerprint matches, else loaded (pydantic) and memoised."""
    environ = os.environ if environ is None else environ
    pdir = pdir or patches_dir(environ)
    tid = tree_id + "\0" + version
    base = None
    if cache is not None:
        key, base = memo_key("set-", pdir, tid, environ, cache)
        hit = cache.load_memo(key)
        if hit is not None and hit.get("format") == 1 and not hit.get("needs_profile"):
            return hit
    from ..load import load_patch_set

    resolved = build_resolved(load_patch_set(pdir), version, environ)
    if cache is not None and base is not None:
        store_keyed(cache, "set-", base, pdir, tid, environ, resolved, bool(resolved.get("needs_profile")))
    return resolved


# ----------------------------------------------------------------------------- memory plans


def _module_of(rel: str) -> str | None:
    if not rel.endswith(".py"):
        return None
    mod = rel[:-3].replace("/", ".")
    if mod.endswith(".__init__"):
        mod = mod[: -len(".__init__")]
    return mod


def cold_memory_plan(root: str, environ, cache: HookCache | None, pdir: str) -> dict:
    """Plan the patch set over the pristine on-disk texts: the same ``build_plan`` apply runs."""
    from ..commit import decode
    from ..load import load_patch_set
    from ..plan import build_plan
    from ..tree import open_tree

    version = open_tree(root).version
    patch_set = load_patch_set(pdir)
    reads: dict[str, str | None] = {}

    def read(rel: str) -> str | None:
        data = _read(os.path.join(root, rel))
        reads[rel] = None if data is None else _sha256(data)
        return None if data is None else decode(data, rel)

    plan = build_plan(patch_set, read, version, environ=environ, check_compile=False)
    problems = [p.render() for p in plan.problems]
    served: dict[str, dict] = {}
    digest = plan.digest
    compiled = {}
    for rel, ch in sorted(plan.changes.items()):  # even when the plan failed: a compile error says more
        mod = _module_of(rel)
        if mod is None or not mod.startswith("vllm"):
            problems.append(f"{rel}: in-memory mode serves Python modules only; this change needs apply")
            continue
        origin = os.path.join(root, rel)
        try:
            code = compile(ch.new, origin, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            problems.insert(0, f"{rel}:{getattr(exc, 'lineno', '') or ''}: patched file does not compile: {exc} "
                               f"(patches {', '.join(ch.patches)})")
            continue
        sha = _sha256(ch.new.encode("utf-8"))
        compiled[rel] = (code, sha, ch.new)
        served[rel] = {"module": mod, "patched_sha256": sha, "patches": list(ch.patches),
                       "created": ch.pristine is None}
    if problems:
        served = {}
        compiled = {}
    after = {"applies": "applied"}
    counts: dict[str, int] = {}
    for v, n in plan.counts().items():
        counts[after.get(v, v)] = counts.get(after.get(v, v), 0) + n
    results = {p.id: after.get(p.status, p.status) for p in plan.patches if p.status != "gated"}
    resolved = build_resolved(patch_set, version, environ)
    memo = {"format": 1, "root": os.path.abspath(root), "version": version, "digest": digest, "reads": reads,
            "served": served, "problems": problems, "counts": dict(sorted(counts.items())), "results": results,
            "resolved": resolved}
    if cache is not None:
        for rel, (code, sha, text) in compiled.items():
            cache.store_source(text)
            cache.store_code(HookCache.code_key(sha, digest, os.path.join(root, rel)), code)
    memo["_compiled"] = compiled  # in-process only; popped before the memo is stored
    return memo


def memory_plan(root: str, environ=None, cache: HookCache | None = None) -> dict:
    """Warm: the memo whose every read file still has its recorded hash. Cold: plan and memoise."""
    environ = os.environ if environ is None else environ
    pdir = patches_dir(environ)
    base = None
    tid = tree_identity(root)
    if cache is not None:
        key, base = memo_key("mem-", pdir, tid, environ, cache)
        memo = cache.load_memo(key)
        if memo is not None and memo.get("format") == 1 and memo.get("root") == os.path.abspath(root):
            if all((None if (d := _read(os.path.join(root, rel))) is None else _sha256(d)) == sha
                   for rel, sha in memo["reads"].items()):
                return memo
    memo = cold_memory_plan(root, environ, cache, pdir)
    if cache is not None and base is not None:
        stored = {k: v for k, v in memo.items() if k != "_compiled"}
        needs = bool((memo.get("resolved") or {}).get("needs_profile"))
        store_keyed(cache, "mem-", base, pdir, tid, environ, stored, needs)
    return memo


# ----------------------------------------------------------------------------- loaders


def prime_linecache(filename: str, text: str) -> None:
    """Make tracebacks and ``inspect`` show the code that runs, not the pristine file.

    An entry whose mtime is None is never invalidated by ``checkcache`` (the
    convention for loader-provided sources).
    """
    import linecache

    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(text), None, lines, filename)


class PatchedLoader:
    """Serves one target module's patched source; compiled with the real filename. Never writes the tree."""

    def __init__(self, finder: SndrFinder, fullname: str, rel: str, origin: str, entry: dict, is_package: bool):
        self.finder = finder
        self.name = fullname
        self.rel = rel
        self.path = origin
        self.entry = entry
        self._is_package = is_package
        self._source: str | None = None

    # importlib protocol
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        code = self.get_code(self.name)
        prime_linecache(self.path, self.get_source(self.name))
        module.__sndr_patched__ = tuple(self.entry["patches"])
        exec(code, module.__dict__)
        self.finder.served_modules[self.name] = self.rel
        if self.finder.on_serve is not None:
            self.finder.on_serve()

    # introspection (inspect, linecache, pkgutil, runpy)
    def get_filename(self, fullname=None) -> str:
        return self.path

    def is_package(self, fullname=None) -> bool:
        return self._is_package

    def get_source(self, fullname=None) -> str:
        if self._source is None:
            self._source = self.finder.patched_source(self.rel, self.entry)
        return self._source

    def get_code(self, fullname=None):
        return self.finder.patched_code(self.rel, self.entry, self.get_source())

    def get_data(self, path: str) -> bytes:
        if os.path.abspath(path) == self.path:
            return self.get_source().encode("utf-8")
        with open(path, "rb") as fh:
            return fh.read()

    def get_resource_reader(self, fullname=None):
        if not self._is_package:
            return None
        from importlib.readers import FileReader

        return FileReader(self)  # data files of a served package come from its real directory


class _PostImportLoader:
    """Wraps the real loader: executes the module, restores the real loader, runs the hooks."""

    def __init__(self, loader, finder: SndrFinder, fullname: str):
        self._loader = loader
        self._finder = finder
        self._name = fullname

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        except AttributeError:
            pass
        self._finder.run_hooks(self._name, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


# ----------------------------------------------------------------------------- the finder


class SndrFinder:
    """One ``sys.meta_path`` entry: in-memory serving (when enabled) and post-import hooks."""

    def __init__(self, memory: bool = False, environ=None):
        self.memory = memory
        self.environ = os.environ if environ is None else environ
        self._lock = _thread.RLock()
        self._in_find: set[int] = set()
        self.hooks: dict[str, list] = {}
        self.activated = False
        self.inert_reason = ""
        self.root: str | None = None
        self.plan: dict | None = None
        self.targets: dict[str, tuple[str, dict]] = {}  # module -> (rel, served entry)
        self.served_modules: dict[str, str] = {}
        self.preimported: list[str] = []
        self.problems: list[str] = []
        self.cache: HookCache | None = None
        self._compiled: dict = {}
        # called after a module was served (register() refreshes the attestation)
        self.on_serve: Callable[[], None] | None = None

    # -- post-import hooks ---------------------------------------------------

    def watch(self, fullname: str, hook) -> None:
        """Call ``hook(module)`` right after ``fullname`` executes (now, if it already has)."""
        module = sys.modules.get(fullname)
        if module is not None and not _initialising(module):
            hook(module)
            return
        with self._lock:
            self.hooks.setdefault(fullname, []).append(hook)

    def run_hooks(self, fullname: str, module) -> None:
        with self._lock:
            hooks = self.hooks.pop(fullname, [])
        for hook in hooks:
            hook(module)  # a strict-mode failure propagates: the import fails with sndr's message

    # -- meta path protocol ----------------------------------------------------

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.hooks and fullname not in self.targets and not (
                self.memory and not self.activated and fullname == "vllm"):
            return None
        me = _thread.get_ident()
        if me in self._in_find:
            return None
        self._in_find.add(me)
        try:
            return self._find(fullname, path, target)
        finally:
            self._in_find.discard(me)

    def _real_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, SndrFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _find(self, fullname, path, target):
        spec = self._real_spec(fullname, path, target)
        if spec is None and fullname in self.targets and self.targets[fullname][1].get("created"):
            return self._serve(fullname, None)  # a module the patch set creates: no file on disk
        if spec is None:
            return None
        if self.memory and not self.activated and fullname == "vllm":
            self._activate(spec)
        if fullname in self.targets:
            served = self._serve(fullname, spec)
            if served is not None:
                spec = served
        if fullname in self.hooks and spec.loader is not None:
            spec.loader = _PostImportLoader(spec.loader, self, fullname)
        return spec

    def _serve(self, fullname: str, spec: ModuleSpec | None) -> ModuleSpec | None:
        rel, entry = self.targets[fullname]
        assert self.root is not None  # targets are set only after _activate_inner set the root
        origin = os.path.join(self.root, rel)
        if spec is None:
            is_pkg = rel.endswith("/__init__.py")
            loader = PatchedLoader(self, fullname, rel, origin, entry, is_pkg)
            # ModuleSpec takes any PEP 451 loader; typeshed wants the importlib.abc.Loader ABC
            new = ModuleSpec(fullname, loader, origin=origin, is_package=is_pkg)  # type: ignore[arg-type]
            if is_pkg:
                new.submodule_search_locations = [os.path.dirname(origin)]
            new.has_location = True
            return new
        if spec.origin is None or os.path.realpath(spec.origin) != os.path.realpath(origin):
            self.problems.append(f"{fullname} resolves to {spec.origin}, not {origin}: served pristine")
            log(f"in-memory hook: {fullname} resolves to {spec.origin}, not the planned {origin}; "
                f"it runs WITHOUT patches {', '.join(entry['patches'])}", once_key="moved:" + fullname)
            return None
        locations = spec.submodule_search_locations
        is_pkg = locations is not None
        loader = PatchedLoader(self, fullname, rel, origin, entry, is_pkg)
        new = ModuleSpec(fullname, loader, origin=origin, is_package=is_pkg)  # type: ignore[arg-type]  # as above
        if locations is not None:
            new.submodule_search_locations = list(locations)
        new.has_location = True
        return new

    # -- activation: the first ``import vllm`` -----------------------------------

    def _activate(self, vllm_spec: ModuleSpec) -> None:
        self.activated = True
        try:
            self._activate_inner(vllm_spec)
        except Exception as exc:  # noqa: BLE001 - never break ``import vllm``; register() reports it
            self.targets = {}
            self.problems.append(f"in-memory hook failed to plan: {_describe(exc)}")
            log(f"in-memory hook failed to plan the patch set: {_describe(exc)}; vLLM runs UNPATCHED "
                f"(SNDR_STRICT=1 makes startup fail)", once_key="activate")

    def _activate_inner(self, vllm_spec: ModuleSpec) -> None:
        from .. import env

        if self.environ.get(env.HOOK, "1").strip().lower() in ("0", "false", "no", "off"):
            self.inert_reason = f"disabled by {env.HOOK}=0"
            return
        if not vllm_spec.submodule_search_locations:
            self.inert_reason = "vllm is not a package on this path"
            return
        root = os.path.dirname(os.path.abspath(list(vllm_spec.submodule_search_locations)[0]))
        override = self.environ.get(env.TREE)
        if override and os.path.realpath(override) != os.path.realpath(root):
            self.inert_reason = f"SNDR_TREE={override} but vllm is imported from {root}"
            self.problems.append(self.inert_reason)
            log(f"in-memory hook: {self.inert_reason}; not serving patches", once_key="tree-mismatch")
            return
        self.root = root
        from ..state import LEDGER, state_path

        if os.path.exists(state_path(root, LEDGER)):
            self.inert_reason = "the tree is patched on disk (it has a ledger); the in-memory hook stays out of the way"
            return
        self.cache = open_cache(self.environ)
        plan = memory_plan(root, self.environ, self.cache)
        self._compiled = plan.pop("_compiled", {})
        self.plan = plan
        self.problems.extend(plan["problems"])
        if plan["problems"]:
            log("in-memory hook: the patch set does not apply to " + root + "; vLLM runs UNPATCHED:\n  "
                + "\n  ".join(plan["problems"]), once_key="plan-problems")
        self.targets = {e["module"]: (rel, e) for rel, e in plan["served"].items()}
        self.preimported = sorted(m for m in self.targets if m in sys.modules)
        for m in self.preimported:
            log(f"in-memory hook: {m} was imported before the hook could patch it; this process runs its "
                f"PRISTINE code (patches {', '.join(self.targets[m][1]['patches'])})", once_key="pre:" + m)

    # -- serving -------------------------------------------------------------

    def patched_source(self, rel: str, entry: dict) -> str:
        if rel in self._compiled:
            return self._compiled[rel][2]
        text = self.cache.load_source(entry["patched_sha256"]) if self.cache is not None else None
        if text is None:
            text = self._replan_source(rel)
        return text

    def _replan_source(self, rel: str) -> str:
        """The cached source went missing: plan again (pristine hashes were checked at activation)."""
        assert self.root is not None and self.plan is not None  # serving happens only after activation planned
        memo = cold_memory_plan(self.root, self.environ, self.cache, patches_dir(self.environ))
        compiled = memo.pop("_compiled", {})
        if rel not in compiled or memo["served"].get(rel, {}).get("patched_sha256") != \
                self.plan["served"][rel]["patched_sha256"]:
            raise ImportError(f"sndr: the patched source of {rel} changed while the process was starting; restart it")
        self._compiled.update(compiled)
        return compiled[rel][2]

    def patched_code(self, rel: str, entry: dict, source: str):
        if rel in self._compiled:
            return self._compiled[rel][0]
        assert self.root is not None and self.plan is not None  # serving happens only after activation planned
        origin = os.path.join(self.root, rel)
        sha = _sha256(source.encode("utf-8"))
        if sha != entry["patched_sha256"]:
            raise ImportError(f"sndr: patched source of {rel} does not match the plan")
        key = HookCache.code_key(sha, self.plan["digest"], origin)
        code = self.cache.load_code(key) if self.cache is not None else None
        if code is None:
            code = compile(source, origin, "exec", dont_inherit=True)
            if self.cache is not None:
                self.cache.store_code(key, code)
        return code

    # -- reporting -------------------------------------------------------------

    def text_state(self) -> dict:
        """What register() attests for in-memory text patches."""
        out = {"active": bool(self.memory and self.activated and self.plan is not None and not self.inert_reason),
               "inert_reason": self.inert_reason, "root": self.root, "problems": list(self.problems),
               "preimported": list(self.preimported), "served": dict(self.served_modules),
               "pending": sorted(m for m in self.targets if m not in self.served_modules and m not in sys.modules)}
        # A target imported by someone else (another finder, or before us) runs pristine code.
        out["bypassed"] = sorted(m for m in self.targets if m in sys.modules and m not in self.served_modules
                                 and m not in self.preimported
                                 and getattr(sys.modules[m], "__sndr_patched__", None) is None)
        return out


def _initialising(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _describe(exc: BaseException) -> str:
    render = getattr(exc, "render", None)
    if callable(render):
        try:
            return render().replace("\n", "; ")
        except Exception:  # noqa: BLE001
            pass
    return f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------- installation

_INSTALL_LOCK = _thread.RLock()


def active_finder() -> SndrFinder | None:
    for f in sys.meta_path:
        if isinstance(f, SndrFinder):
            return f
    return None


def install(memory: bool = True, environ=None) -> SndrFinder:
    """Put the finder first on ``sys.meta_path`` (idempotent); ``memory`` turns on in-memory serving.

    Called by the ``.pth`` boot at interpreter start. Called later (vLLM
    already imported), it plans at once and says loudly which target modules
    already run their pristine code.
    """
    with _INSTALL_LOCK:
        finder = active_finder()
        if finder is None:
            finder = SndrFinder(memory=memory, environ=environ)
            sys.meta_path.insert(0, finder)
        elif memory and not finder.memory:
            finder.memory = True
        if finder.memory and not finder.activated and "vllm" in sys.modules:
            spec = getattr(sys.modules["vllm"], "__spec__", None)
            if spec is not None:
                finder._activate(spec)
        return finder


def post_import_finder() -> SndrFinder:
    """The finder that carries post-import hooks (installs a non-serving one if needed)."""
    return install(memory=False)


def uninstall() -> None:
    with _INSTALL_LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SndrFinder)]
