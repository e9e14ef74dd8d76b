"""The in-memory import hook and post-import hooks: one ``sys.meta_path`` finder.

* **In-memory mode.** ``python -m sndr hook install`` writes a ``.pth`` line that
  imports :mod:`sndr._boot`, which calls :func:`install`. The finder stays
  inert until ``vllm`` itself is imported; then it locates the tree, plans the
  patch set over the pristine on-disk texts (:func:`sndr.startup.resolve.memory_plan`,
  the very planner ``apply`` uses), and serves the patched source of each target
  module. Code is compiled with the real filename, so tracebacks and ``inspect``
  point at the real file, and :mod:`linecache` is primed with the patched lines
  so they also *show* the code that runs. The tree is never written.
* **Post-import hooks** (:meth:`SndrFinder.watch`): run a callback right after
  a module executes, before anyone can ``from mod import name``. Runtime
  patches use them to patch a module when it is imported.

Compiled code and patched sources come from the owner-checked, sealed cache of
:mod:`sndr.startup.hookcache` (a mismatch is recompiled, never trusted); the
resolved set and the memory plan from the memos of :mod:`sndr.startup.resolve`,
so a warm start neither imports pydantic nor runs the planner.

This module is imported at interpreter start by the ``.pth``; its top-level
imports are kept to what the interpreter has already loaded (and the stdlib-only
:mod:`sndr.startup.common`).
"""

from __future__ import annotations

import _thread
import os
import sys
from importlib.machinery import ModuleSpec

from .common import describe, log, sha256

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: interpreter start does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable

    from .hookcache import HookCache

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
            self.problems.append(f"in-memory hook failed to plan: {describe(exc)}")
            log(f"in-memory hook failed to plan the patch set: {describe(exc)}; vLLM runs UNPATCHED "
                f"(SNDR_STRICT=1 makes startup fail)", once_key="activate")

    def _activate_inner(self, vllm_spec: ModuleSpec) -> None:
        from .. import env

        if not env.hook_enabled(self.environ):
            self.inert_reason = f"disabled by {env.HOOK}={self.environ.get(env.HOOK)!r}"
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
        from .hookcache import open_cache
        from .resolve import memory_plan

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
        from .resolve import cold_memory_plan, patches_dir

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
        sha = sha256(source.encode("utf-8"))
        if sha != entry["patched_sha256"]:
            raise ImportError(f"sndr: patched source of {rel} does not match the plan")
        from .hookcache import HookCache

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
