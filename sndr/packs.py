"""Plugin packs: third-party packages that ship patches through pluggy.

A pack is an installed distribution with an entry point in the group
``sndr.patches``. The entry point names the pack and points at a module (or
object) that implements the hook below::

    # pyproject.toml of the pack
    [project.entry-points."sndr.patches"]
    acme = "acme_sndr"

    # acme_sndr/__init__.py
    from pathlib import Path
    import pluggy
    hookimpl = pluggy.HookimplMarker("sndr")

    @hookimpl
    def sndr_patch_dirs():
        return [Path(__file__).parent / "patches"]

Rules, enforced here and in :mod:`sndr.load`:

* Patch files are data: read with ``tomllib`` and validated like built-ins,
  never executed. Only the pack's hook module is imported, to ask for its
  directories.
* Ids are namespaced: every id of pack ``acme`` starts with ``ACME_``, so a
  pack can never shadow a built-in (load also refuses any duplicate id).
* Runtime code of a pack patch may come from the pack's own top-level package
  or from ``sndr``; nothing else (checked again when the runtime edit runs).
* Pack patches are gated exactly like built-ins (lifecycle, default,
  ``SNDR_ENABLE_<ID>``, ``vllm`` specifier).

Discovery is memoised by the startup path (:func:`discover_cached`), keyed by
the names of the distributions on ``sys.path`` (:func:`discovery_key`), so a
warm vLLM start does not read every distribution's entry points.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from typing import Any

GROUP = "sndr.patches"
PROJECT = "sndr"


def _markers():
    import pluggy

    return pluggy.HookspecMarker(PROJECT), pluggy.HookimplMarker(PROJECT)


def __getattr__(name):
    # ``from sndr.packs import hookimpl`` for pack authors, without importing
    # pluggy on the startup path.
    if name == "hookimpl":
        return _markers()[1]
    if name == "hookspec":
        return _markers()[0]
    raise AttributeError(name)


def _spec_class():
    hookspec, _ = _markers()

    class PackSpec:
        """The hooks a pack implements."""

        @hookspec
        def sndr_patch_dirs(self):
            """Return the directories (str or Path) of this pack's patch TOML files."""

    return PackSpec


class Pack:
    """One installed pack. (A plain class: dataclasses cost import time on vLLM's startup path.)"""

    __slots__ = ("name", "value", "module", "dist", "version", "dirs")

    def __init__(self, name: str, value: str, module: str, dist: str = "", version: str = "", dirs=()):
        self.name = name  # entry point name: the namespace
        self.value = value  # entry point value, e.g. "acme_sndr" or "acme_sndr.hooks:plugin"
        self.module = module  # top-level package: where the pack's runtime code may live
        self.dist = dist
        self.version = version
        self.dirs = tuple(dirs)

    def __eq__(self, other):
        return isinstance(other, Pack) and self.to_json() == other.to_json()

    def __hash__(self):
        return hash((self.name, self.value))

    def __repr__(self) -> str:
        return f"Pack({self.name!r}, module={self.module!r}, dirs={list(self.dirs)!r})"

    @property
    def prefix(self) -> str:
        return id_prefix(self.name)

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "module": self.module, "dist": self.dist,
                "version": self.version, "dirs": list(self.dirs)}


def id_prefix(pack_name: str) -> str:
    """``acme-labs`` -> ``ACME_LABS_``: every id of the pack must start with it (case-insensitive)."""
    return re.sub(r"[^A-Za-z0-9]", "_", pack_name).upper() + "_"


def _top_module(value: str) -> str:
    return value.split(":", 1)[0].strip().split(".", 1)[0]


@lru_cache(maxsize=1)
def _discover() -> tuple[Pack, ...]:
    import pluggy

    from .errors import Problem, SndrError

    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(_spec_class())
    problems = []
    try:
        pm.load_setuptools_entrypoints(GROUP)
    except Exception as exc:  # noqa: BLE001 - name the pack that failed to import
        raise SndrError(Problem("pack_import", f"a plugin pack failed to load: {type(exc).__name__}: {exc}",
                                key=GROUP, hint="uninstall or fix the pack; `pip show` names its distribution")) from None
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    from importlib.metadata import entry_points

    values = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    packs = []
    for name, plugin in sorted(pm.list_name_plugin()):
        if plugin is None:
            continue
        value = values.get(name, getattr(plugin, "__name__", name))
        dist = dists.get(id(plugin))
        impl = pm.hook.sndr_patch_dirs
        dirs: list[str] = []
        for hookimpl in impl.get_hookimpls():
            if hookimpl.plugin is not plugin:
                continue
            try:
                got: Any = hookimpl.function()  # a pack's code: whatever it returns is checked below
            except Exception as exc:  # noqa: BLE001
                problems.append(Problem("pack_hook_failed", f"pack {name}: sndr_patch_dirs() raised {exc!r}", key=GROUP))
                continue
            for d in got or []:
                d = os.path.abspath(os.fspath(d))
                if not os.path.isdir(d):
                    problems.append(Problem("pack_dir_missing", f"pack {name}: patch directory does not exist",
                                            file=d, key=GROUP))
                    continue
                dirs.append(d)
        packs.append(Pack(name=name, value=value, module=_top_module(value),
                          dist=getattr(dist, "project_name", "") if dist else "",
                          version=getattr(dist, "version", "") if dist else "", dirs=tuple(dirs)))
    if problems:
        raise SndrError(problems)
    return tuple(packs)


def discover() -> list[Pack]:
    """Installed packs, via pluggy's entry point loading. Cached per process."""
    return list(_discover())


def refresh() -> None:
    """Forget the per-process discovery (tests install packs at run time)."""
    _discover.cache_clear()


def pack_of_source(source: str, packs: list[Pack] | None = None) -> Pack | None:
    """The pack whose directories hold the patch file ``source``, or None (a built-in)."""
    packs = discover() if packs is None else packs
    src = os.path.abspath(source)
    for pack in packs:
        for d in pack.dirs:
            if src.startswith(d.rstrip(os.sep) + os.sep):
                return pack
    return None


def module_allowed(module: str, *extra: str) -> bool:
    """Runtime code may come from ``sndr`` or the listed packages (and their submodules) only."""
    for top in ("sndr",) + tuple(e for e in extra if e):
        if module == top or module.startswith(top + "."):
            return True
    return False


# ----------------------------------------------------------------------------- startup memo


def discovery_key() -> str:
    """Changes when a distribution is installed or removed on ``sys.path``.

    The names of the ``*.dist-info``/``*.egg-info``/``*.egg-link`` entries of
    every ``sys.path`` directory, in order. No mtimes: a cwd such as /tmp changes
    all the time. (A pack upgraded in place under the same distribution name and
    version keeps its key; its patch files are fingerprinted by content anyway.)
    """
    import hashlib

    h = hashlib.sha256()
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info", ".egg-link")))
        except OSError:
            h.update(f"{entry}\0-\n".encode())
            continue
        h.update(f"{entry}\0{'/'.join(names)}\n".encode())
    return h.hexdigest()


def discover_cached(cache=None) -> list[dict]:
    """Discovery as JSON, memoised in the hook cache under :func:`discovery_key`."""
    key = "packs-" + discovery_key()
    if cache is not None:
        hit = cache.load_memo(key)
        if hit is not None and isinstance(hit.get("packs"), list):
            return hit["packs"]
    found = [p.to_json() for p in discover()]
    if cache is not None:
        cache.store_memo(key, {"packs": found})
    return found
