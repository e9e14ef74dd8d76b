"""The resolved patch set and the memory plan, memoised: what a warm start reads instead of planning.

* :func:`resolve_set`: the enabled set, its digest and runtime edits, as plain
  JSON (:func:`build_resolved`, from :func:`sndr.plan.enabled_set`), memoised
  under :func:`set_fingerprint`;
* :func:`memory_plan`: the patched sources in-memory mode serves, planned over
  the pristine on-disk texts by the very planner ``apply`` runs, memoised with
  the hash of every file it read;
* the fingerprint of a resolution's inputs: the patch files, ``SNDR_ENABLE_*``,
  the tree's identity, the Python and sndr's own code (:data:`STAMP_MODULES`).

The planner, the loader and pydantic are imported inside the functions that run
them: a memo hit (a warm start) imports none of them.
"""

from __future__ import annotations

import os

from .common import read_bytes, sha256
from .hookcache import HookCache, py_tag


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
STAMP_MODULES = ("model.py", "load.py", "plan.py", "profile.py", "classify.py", "binding.py", "packs.py", "env.py",
                 "fsio.py", "locate.py", "state.py", "startup/common.py", "startup/hookcache.py", "startup/resolve.py",
                 "startup/importer.py", "startup/runtime.py",
                 # the in-memory plan reads the tree's version and decodes its files through these
                 "commit.py", "tree.py", "treespec.py", "treeview.py", "tree_git.py", "tree_installed.py",
                 "tree_release.py", "tree_wheel.py")


def package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_stamp() -> list[tuple[str, int | None, int | None]]:
    root = package_root()
    out: list[tuple[str, int | None, int | None]] = []
    for name in STAMP_MODULES:
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
        data = read_bytes(os.path.join(directory, n)) or b""
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
    h.update(repr((py_tag(), code_stamp(), tree_id)).encode())
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
        data = read_bytes(os.path.join(root, rel))
        parts.append(sha256(data) if data is not None else "-")
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


def module_of(rel: str) -> str | None:
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
        data = read_bytes(os.path.join(root, rel))
        reads[rel] = None if data is None else sha256(data)
        return None if data is None else decode(data, rel)

    plan = build_plan(patch_set, read, version, environ=environ, check_compile=False)
    problems = [p.render() for p in plan.problems]
    served: dict[str, dict] = {}
    digest = plan.digest
    compiled = {}
    for rel, ch in sorted(plan.changes.items()):  # even when the plan failed: a compile error says more
        mod = module_of(rel)
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
        sha = sha256(ch.new.encode("utf-8"))
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
            if all((None if (d := read_bytes(os.path.join(root, rel))) is None else sha256(d)) == sha
                   for rel, sha in memo["reads"].items()):
                return memo
    memo = cold_memory_plan(root, environ, cache, pdir)
    if cache is not None and base is not None:
        stored = {k: v for k, v in memo.items() if k != "_compiled"}
        needs = bool((memo.get("resolved") or {}).get("needs_profile"))
        store_keyed(cache, "mem-", base, pdir, tid, environ, stored, needs)
    return memo
