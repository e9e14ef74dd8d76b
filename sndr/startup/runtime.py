"""Runtime patches: replace an attribute such as ``vllm.v1.core.sched.scheduler:Scheduler.schedule``.

Order of work for each edit (check everything, then touch anything):

1. **Security.** The replacement's module must be ``sndr`` (or a submodule) or
   belong to the installed plugin pack that shipped the patch. Patch files
   are data; they can only *name* code that is already trusted.
2. **Conflicts.** Two edits on one target are a conflict unless every edit
   after the first declares ``chain = true`` (it then wraps the previous one).
   A conflict applies neither.
3. **Binding check.** :func:`sndr.binding.check_binding` on the module's source,
   the same function the preflight runs on a candidate tree, so the two can
   never disagree; then the live object's signature. A mismatch is the
   verdict ``drifted``, not a crash.
4. **Deferred.** A target whose module is not imported yet is patched right
   after the module executes (a post-import hook on sndr's finder), before
   anyone can ``from module import name`` it. Its static check runs at once.
5. **Install**, idempotently: each replacement carries ``__sndr_patch__``.
   :meth:`RuntimePatcher.revert` restores the originals in reverse order and
   refuses an attribute someone else replaced after sndr did.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ..packs import module_allowed

MARK = "__sndr_patch__"
_MISSING = object()


class StrictError(RuntimeError):
    """A required patch is not active and ``SNDR_STRICT=1``: vLLM must not start."""


class Outcome:
    """What one runtime edit is in this process.

    (Plain classes rather than dataclasses here: building a dataclass costs
    about a millisecond at import, and this module is on vLLM's startup path.)
    """

    __slots__ = ("patch", "name", "target", "verdict", "required", "reason")

    def __init__(self, patch: str, name: str, target: str, verdict: str, required: bool = True, reason: str = ""):
        self.patch = patch
        self.name = name
        self.target = target
        # applied | pending | drifted | file_missing | ambiguous | refused | failed | reverted
        self.verdict = verdict
        self.required = required
        self.reason = reason

    def __eq__(self, other):
        return isinstance(other, Outcome) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"Outcome({self.key} {self.verdict}{': ' + self.reason if self.reason else ''})"

    @property
    def key(self) -> str:
        return f"{self.patch}/{self.name}"

    @property
    def ok(self) -> bool:
        return self.verdict in ("applied", "pending") or not self.required

    def to_json(self) -> dict:
        return {"patch": self.patch, "name": self.name, "target": self.target, "verdict": self.verdict,
                "required": self.required, "reason": self.reason}


class _Installed:
    __slots__ = ("spec", "owner", "attr", "original", "installed")

    def __init__(self, spec: dict, owner, attr: str, original, installed):
        self.spec = spec
        self.owner = owner
        self.attr = attr
        self.original = original  # what the owner held in its own __dict__ (or _MISSING when inherited)
        self.installed = installed


class RuntimePatcher:
    """Applies, tracks and reverts the runtime edits of one process.

    ``read_source(module_name, module) -> (text | None, filename)`` returns the
    source the module was (or will be) executed from; the default,
    :func:`default_read_source`, also knows the patched text the in-memory
    hook serves. ``memo`` (a HookCache) persists binding checks.
    ``on_change`` is called whenever an outcome changes (register() rewrites
    the attestation then).
    """

    def __init__(self, strict: bool = False, read_source=None, memo=None, on_change=None):
        self.strict = strict
        self.read_source = read_source
        self.memo = memo
        self.on_change = on_change
        self.outcomes: dict[str, Outcome] = {}
        self._installed: list[_Installed] = []

    # -- public ----------------------------------------------------------------

    def apply(self, specs: list[dict], defer: bool = True) -> list[Outcome]:
        """Apply runtime edit specs (dicts: RuntimeEdit fields + ``patch`` + ``allowed``)."""
        fresh = [s for s in specs if _key(s) not in self.outcomes or self.outcomes[_key(s)].verdict
                 not in ("applied", "pending")]
        for s in fresh:
            self._set(Outcome(s["patch"], s["name"], s["target"], "pending", s.get("required", True)))
        refused = {_key(s) for s in fresh if self._refuse(s)}
        conflicted = self._conflicts([s for s in fresh if _key(s) not in refused])
        by_module: dict[str, list[dict]] = {}
        for s in fresh:
            if _key(s) in refused or _key(s) in conflicted:
                continue
            by_module.setdefault(s["target"].split(":", 1)[0], []).append(s)
        for module_name, group in by_module.items():
            module = sys.modules.get(module_name)
            if module is not None and not _initialising(module):
                self._apply_module(module, group)
                continue
            for s in group:  # static check now: a drifted target is loud at startup, not mid-import
                verdict, reason = self._static(s, module_name)
                if verdict != "applies":
                    self._fail(s, verdict, reason)
            live = [s for s in group if self.outcomes[_key(s)].verdict == "pending"]
            if live and defer:
                from .importer import post_import_finder

                post_import_finder().watch(module_name, lambda mod, g=live: self._apply_module(mod, g))
        return [self.outcomes[_key(s)] for s in specs]

    def revert(self, force: bool = False) -> list[str]:
        """Restore every original, newest first. Returns problems (attributes changed by someone else)."""
        problems = []
        for rec in reversed(self._installed):
            current = rec.owner.__dict__.get(rec.attr, _MISSING) if _has_dict(rec.owner) else \
                getattr(rec.owner, rec.attr, _MISSING)
            if current is not rec.installed and not force:
                problems.append(f"{rec.spec['target']}: replaced by someone else after sndr patched it; not reverted")
                continue
            if rec.original is _MISSING:
                try:
                    delattr(rec.owner, rec.attr)
                except AttributeError:
                    pass
            else:
                setattr(rec.owner, rec.attr, rec.original)
            self._set(Outcome(rec.spec["patch"], rec.spec["name"], rec.spec["target"], "reverted",
                              rec.spec.get("required", True)))
        self._installed = [r for r in self._installed if self.outcomes[_key(r.spec)].verdict != "reverted"]
        return problems

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes.values():
            out[o.verdict] = out.get(o.verdict, 0) + 1
        return dict(sorted(out.items()))

    def missing_required(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if not o.ok]

    # -- checks ----------------------------------------------------------------

    def _refuse(self, s: dict) -> bool:
        rmod = s["replacement"].split(":", 1)[0]
        allowed = [a for a in s.get("allowed", ["sndr"]) if a]
        if not module_allowed(rmod, *allowed):
            self._fail(s, "refused", f"replacement module {rmod} is outside sndr and the patch's plugin pack "
                                     f"(allowed: {', '.join(sorted(set(allowed) | {'sndr'}))}); runtime code runs only "
                                     f"from trusted packages")
            return True
        return False

    def _conflicts(self, specs: list[dict]) -> set[str]:
        by_target: dict[str, list[dict]] = {}
        for s in specs:
            by_target.setdefault(s["target"], []).append(s)
        for rec in self._installed:  # edits installed by an earlier apply() call
            by_target.setdefault(rec.spec["target"], []).insert(0, rec.spec)
        bad: set[str] = set()
        for target, group in by_target.items():
            if len(group) > 1 and not all(s.get("chain") for s in group[1:]):
                names = ", ".join(_key(s) for s in group)
                for s in group:
                    if _key(s) in {_key(x) for x in specs}:
                        self._fail(s, "ambiguous", f"conflict: {names} all replace {target}; declare chain = true "
                                                   f"on every edit after the first to stack them")
                        bad.add(_key(s))
        return bad

    def _source_of(self, module_name: str, module=None) -> tuple[str | None, str]:
        if self.read_source is not None:
            return self.read_source(module_name, module)
        return default_read_source(module_name, module)

    def _static(self, s: dict, module_name: str, module=None) -> tuple[str, str]:
        text, filename = self._source_of(module_name, module)
        if text is None:
            return "file_missing", f"module {module_name} has no readable source ({filename or 'not found'})"
        return static_binding(s, text, module_name, self.memo)

    # -- install -----------------------------------------------------------------

    def _apply_module(self, module, specs: list[dict]) -> None:
        for s in specs:
            try:
                self._apply_one(module, s)
            except StrictError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken replacement is a verdict, not a crash
                self._fail(s, "failed", f"{type(exc).__name__}: {exc}")

    def _apply_one(self, module, s: dict) -> None:
        key = _key(s)
        if self.outcomes.get(key) is not None and self.outcomes[key].verdict == "applied":
            return
        verdict, reason = self._static(s, module.__name__, module)
        if verdict != "applies":
            self._fail(s, verdict, reason)
            return
        qual = s["target"].split(":", 1)[1]
        owner = module
        parts = qual.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, _MISSING)
            if owner is _MISSING:
                self._fail(s, "drifted", f"{qual}: {part} not found on the live module {module.__name__}")
                return
        attr = parts[-1]
        own = owner.__dict__.get(attr, _MISSING) if _has_dict(owner) else _MISSING
        current = own if own is not _MISSING else getattr(owner, attr, _MISSING)
        if current is _MISSING:
            self._fail(s, "drifted", f"{s['target']} not found on the live module")
            return
        if getattr(current, MARK, None) == key:
            self._set(Outcome(s["patch"], s["name"], s["target"], "applied", s.get("required", True),
                              "already installed"))
            return
        stacked = getattr(current, MARK, None)
        if stacked is not None and not s.get("chain"):
            self._fail(s, "ambiguous", f"conflict: {s['target']} is already replaced by {stacked}; declare chain = true")
            return
        if s.get("signature") is not None and stacked is None:
            from ..binding import signature_of_callable

            live = signature_of_callable(_unwrap_descriptor(current))
            if live is not None and live != s["signature"]:
                self._fail(s, "drifted", f"live signature of {s['target']} is {live}, the patch declares "
                                         f"{s['signature']} (replaced by another plugin?)")
                return
        rmod, rattr = s["replacement"].split(":", 1)
        replacement: Any = importlib.import_module(rmod)
        for part in rattr.split("."):
            replacement = getattr(replacement, part)
        new = replacement(own if own is not _MISSING else current) if s.get("wrap") else replacement
        try:
            setattr(new, MARK, key)
        except (AttributeError, TypeError):
            pass  # builtins and slotted objects cannot carry the mark; idempotence then rests on outcomes
        setattr(owner, attr, new)
        self._installed.append(_Installed(s, owner, attr, own, new))
        self._set(Outcome(s["patch"], s["name"], s["target"], "applied", s.get("required", True)))

    # -- bookkeeping ---------------------------------------------------------------

    def _fail(self, s: dict, verdict: str, reason: str) -> None:
        o = Outcome(s["patch"], s["name"], s["target"], verdict, s.get("required", True), reason)
        self._set(o)
        if o.required:
            msg = f"runtime patch {o.key} on {o.target} is {verdict}: {reason}"
            if self.strict:
                raise StrictError(f"sndr: {msg} (SNDR_STRICT=1: a required patch is not active, refusing to start)")
            from .common import log

            log(f"{msg}; this process runs WITHOUT it", once_key="rt:" + o.key)

    def _set(self, o: Outcome) -> None:
        self.outcomes[o.key] = o
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # noqa: BLE001 - reporting must never break patching
                pass


def _key(s: dict) -> str:
    return f"{s['patch']}/{s['name']}"


def _has_dict(obj) -> bool:
    return hasattr(obj, "__dict__")


def _initialising(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _unwrap_descriptor(obj):
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    return obj


def default_read_source(module_name: str, module=None) -> tuple[str | None, str]:
    """(source text, filename) the module runs (or will run) from. Never imports anything.

    An imported module: the patched text when sndr's in-memory loader served
    it, else its file. A module not imported yet: the file it would be loaded
    from, found under its top-level package's ``__path__`` (or served by the
    in-memory hook, which then answers with the patched text).
    """
    if module is not None:
        loader = getattr(getattr(module, "__spec__", None), "loader", None)
        if getattr(module, "__sndr_patched__", None) is not None and loader is not None and hasattr(loader, "get_source"):
            return loader.get_source(module_name), getattr(module, "__file__", "") or ""
        filename = getattr(module, "__file__", None)
    else:
        filename = None
        served = _served_source(module_name)
        if served is not None:
            return served
        top, _, rest = module_name.partition(".")
        pkg = sys.modules.get(top)
        bases = list(getattr(pkg, "__path__", None) or [])
        if pkg is None:  # locate the top-level package without importing it
            from importlib.machinery import PathFinder

            top_spec = PathFinder.find_spec(top)
            if top_spec is not None and top_spec.submodule_search_locations is None and not rest:
                filename = top_spec.origin
            bases = list(top_spec.submodule_search_locations or []) if top_spec is not None else []
        for base in bases:
            stem = os.path.join(base, *rest.split(".")) if rest else base
            for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
                if os.path.isfile(cand):
                    filename = cand
                    break
            if filename:
                break
    if not filename or not filename.endswith(".py"):
        return None, filename or ""
    try:
        with open(filename, "rb") as fh:
            return fh.read().decode("utf-8"), filename
    except (OSError, UnicodeDecodeError):
        return None, filename


def _served_source(module_name: str) -> tuple[str, str] | None:
    """The patched text the in-memory hook will serve for a module not imported yet, if any."""
    importer = sys.modules.get("sndr.startup.importer")
    finder = importer.active_finder() if importer is not None else None
    if finder is None or module_name not in finder.targets:
        return None
    rel, entry = finder.targets[module_name]
    return finder.patched_source(rel, entry), os.path.join(finder.root, rel)


_BINDING_MEMO: dict[str, tuple[str, str]] = {}


def static_binding(s: dict, text: str, module_name: str, cache=None) -> tuple[str, str]:
    """:func:`sndr.binding.check_binding` on ``text``; memoised by the text's sha256 (ast.parse is slow)."""
    import hashlib
    import json

    key = "bind-" + hashlib.sha256(json.dumps(
        [text, s["target"], s.get("signature"), s.get("source_sha256")]).encode()).hexdigest()
    if key in _BINDING_MEMO:
        return _BINDING_MEMO[key]
    hit = cache.load_memo(key) if cache is not None else None
    if hit is not None:
        out = (hit["verdict"], hit["reason"])
    else:
        from ..binding import check_binding, module_file_candidates

        class _Redit:
            target = s["target"]
            signature = s.get("signature")
            source_sha256 = s.get("source_sha256")

        cands = set(module_file_candidates(module_name))

        def read(rel: str) -> str | None:
            if rel in cands:
                return text
            # A re-export (``from x import y``) leads to another module of the
            # same tree: read it beside the top-level package, never import it.
            top_name = module_name.split(".")[0]
            base = getattr(sys.modules.get(top_name), "__file__", None)
            if not base:
                # Not imported yet (a patch bound before ``import vllm``): locate it, never import it.
                from importlib.machinery import PathFinder

                spec = PathFinder.find_spec(top_name)
                base = spec.origin if spec is not None else None
            if not base:
                return None
            path = os.path.join(os.path.dirname(os.path.dirname(base)), rel)
            try:
                with open(path, encoding="utf-8") as fh:
                    return fh.read()
            except OSError:
                return None

        verdict, reason, _ = check_binding(_Redit, read)
        out = (verdict, reason)
        if cache is not None:
            cache.store_memo(key, {"verdict": verdict, "reason": reason})
    _BINDING_MEMO[key] = out
    return out


# ----------------------------------------------------------------------------- diagnostics


def call_counter(original):
    """A wrapper that counts calls (``wrapper.sndr_calls``): proves a patched method runs in a process.

    Use as a runtime edit with ``wrap = true``. Works on plain functions and
    methods; the original's signature and name are kept.
    """
    import functools

    target = _unwrap_descriptor(original)

    @functools.wraps(target)
    def wrapper(*args, **kwargs):
        wrapper.sndr_calls += 1
        return target(*args, **kwargs)

    wrapper.sndr_calls = 0
    if isinstance(original, staticmethod):
        return staticmethod(wrapper)
    if isinstance(original, classmethod):
        return classmethod(wrapper)
    return wrapper

