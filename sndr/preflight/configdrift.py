"""Configuration drift between two vLLM trees: dependencies, env defaults,
engine arguments and runtime-patch targets.

A pin bump moves more than anchors: a dependency pin, an environment default
or an engine-argument default can change the production configuration without
touching a single patched line. This module reads both trees *statically*
(``ast`` and wheel METADATA, never an import of vLLM) and reports what moved.

Public surface::

    compare_config(pin, candidate, watch=None, patches=None) -> ConfigDrift
    load_watch_config(path=None, start=None) -> WatchConfig
    runtime_target_drift(patches, pin, candidate) -> list[RuntimeTargetChange]
    render_markdown(drift) -> str
    render_terminal(drift, console=None) -> None
    json_schema() -> dict

Where each piece lives: the result models and the watch list in
:mod:`.configmodels`, the static readers of one tree in :mod:`.configsource`,
the comparison here, the Markdown and terminal rendering in
:mod:`.configrender`.

A tree is anything with ``read_text(rel) -> str | None``, ``files()``,
``metadata() -> str | None`` and ``version`` (see ``sndr.tree``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import SndrError
from .configmodels import (
    ConfigDrift,
    DependencyChange,
    DependencyDrift,
    EngineArgChange,
    EngineArgDrift,
    EnvChange,
    EnvDrift,
    RuntimeStatus,
    RuntimeTargetChange,
    TreeLike,
    WatchConfig,
    json_schema,
    load_watch_config,
)
from .configrender import render_markdown, render_terminal
from .configsource import Req, Source, config_layout, dependencies, engine_args, env_registry, find_target

__all__ = [
    "ConfigDrift",
    "DependencyChange",
    "DependencyDrift",
    "EngineArgChange",
    "EngineArgDrift",
    "EnvChange",
    "EnvDrift",
    "RuntimeTargetChange",
    "WatchConfig",
    "compare_config",
    "json_schema",
    "load_watch_config",
    "render_markdown",
    "render_terminal",
    "runtime_target_drift",
]


# ============================================================================ env defaults


def _compare_env(pin: Source, cand: Source, watch: WatchConfig) -> EnvDrift:
    old, old_notes = env_registry(pin)
    new, new_notes = env_registry(cand)
    notes = [f"pin: {n}" for n in old_notes] + [f"candidate: {n}" for n in new_notes]
    if old is None or new is None:
        return EnvDrift(available=False, notes=notes + ["environment defaults not compared"])
    drift = EnvDrift(notes=notes, pin_count=len(old), candidate_count=len(new))
    for name in sorted(new.keys() - old.keys()):
        v = new[name]
        drift.added.append(EnvChange(name=name, change="added", new_default=v.default, new_expr=v.expr,
                                     new_annotated=v.annotated, attention=watch.watches_env(name)))
    for name in sorted(old.keys() - new.keys()):
        v = old[name]
        drift.removed.append(EnvChange(name=name, change="removed", old_default=v.default, old_expr=v.expr,
                                       old_annotated=v.annotated, attention=watch.watches_env(name)))
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        if (a.expr, a.default, a.annotated) == (b.expr, b.default, b.annotated):
            continue
        # The getenv default is what runs; the TYPE_CHECKING value is documentation
        # (and sometimes stale), so it decides only when no getenv default was found.
        if a.default is not None and b.default is not None:
            default_changed = a.default != b.default
        else:
            default_changed = a.default != b.default or a.annotated != b.annotated
        drift.changed.append(EnvChange(
            name=name, change="changed", default_changed=default_changed,
            old_default=a.default, new_default=b.default, old_expr=a.expr, new_expr=b.expr,
            old_annotated=a.annotated, new_annotated=b.annotated, attention=watch.watches_env(name)))
    drift.added.sort(key=lambda c: (not c.attention, c.name))
    drift.removed.sort(key=lambda c: (not c.attention, c.name))
    drift.changed.sort(key=lambda c: (not c.attention, not c.default_changed, c.name))
    return drift


# ============================================================================ engine args


def _compare_engine_args(pin: Source, cand: Source, watch: WatchConfig) -> EngineArgDrift:
    old, old_notes = engine_args(pin)
    new, new_notes = engine_args(cand)
    notes = [f"pin: {n}" for n in old_notes] + [f"candidate: {n}" for n in new_notes]
    if old is None or new is None:
        return EngineArgDrift(available=False, notes=notes + ["engine arguments not compared"])
    lo, ln = config_layout(pin), config_layout(cand)
    if lo and ln and lo != ln:
        notes.insert(0, f"vllm.config is a {lo} on the pin and a {ln} on the candidate; "
                        "config-class defaults were resolved through each tree's own layout")
    drift = EngineArgDrift(notes=notes, pin_count=len(old), candidate_count=len(new))
    for name in sorted(new.keys() - old.keys()):
        a = new[name]
        drift.added.append(EngineArgChange(name=name, change="added", new=a.value, new_expr=a.expr, new_type=a.type,
                                           resolved=a.resolved, attention=watch.watches_arg(name)))
    for name in sorted(old.keys() - new.keys()):
        a = old[name]
        drift.removed.append(EngineArgChange(name=name, change="removed", old=a.value, old_expr=a.expr,
                                             old_type=a.type, resolved=a.resolved, attention=watch.watches_arg(name)))
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        if a.value == b.value:
            continue
        drift.changed.append(EngineArgChange(
            name=name, change="changed", old=a.value, new=b.value, old_expr=a.expr, new_expr=b.expr,
            old_type=a.type, new_type=b.type, resolved=a.resolved and b.resolved,
            attention=watch.watches_arg(name)))
    for lst in (drift.added, drift.removed, drift.changed):
        lst.sort(key=lambda c: (not c.attention, c.name))
    return drift


# ============================================================================ dependencies


_OP_WORD = {"==": "pin", "===": "pin", ">=": "floor", ">": "floor", "<": "ceiling", "<=": "ceiling",
            "!=": "excludes", "~=": "compatible"}


def _spec_detail(old: str, new: str) -> str:
    def by_op(spec: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for part in filter(None, spec.split(",")):
            m = re.match(r"(===|==|!=|~=|>=|<=|>|<)(.*)", part.strip())
            if m:
                out.setdefault(m.group(1), []).append(m.group(2))
        return out

    a, b = by_op(old), by_op(new)
    parts = []
    for op in sorted(a.keys() | b.keys(), key=lambda o: list(_OP_WORD).index(o) if o in _OP_WORD else 99):
        va, vb = a.get(op, []), b.get(op, [])
        if va == vb:
            continue
        word = _OP_WORD.get(op, op)
        if op == "!=":
            gone, new_ex = sorted(set(va) - set(vb)), sorted(set(vb) - set(va))
            if new_ex:
                parts.append(f"now excludes {', '.join(new_ex)}")
            if gone:
                parts.append(f"no longer excludes {', '.join(gone)}")
        elif va and vb:
            parts.append(f"{word} {', '.join(va)} -> {', '.join(vb)}")
        elif vb:
            parts.append(f"{word} {op}{', '.join(vb)} added")
        else:
            parts.append(f"{word} {op}{', '.join(va)} dropped")
    return "; ".join(parts)


def _compare_dependencies(pin: TreeLike, cand: TreeLike, watch: WatchConfig) -> DependencyDrift:
    old, src_old, n_old = dependencies(pin)
    new, src_new, n_new = dependencies(cand)
    notes = [f"pin: {n}" for n in n_old] + [f"candidate: {n}" for n in n_new]
    drift = DependencyDrift(source_pin=src_old, source_candidate=src_new, notes=notes)
    if old is None or new is None:
        drift.available = False
        drift.notes.append("dependencies not compared")
        return drift
    if src_old != src_new:
        drift.notes.append(f"the pin's dependencies come from {src_old} and the candidate's from {src_new}; "
                           "groups may not line up")

    def index(reqs: list[Req]) -> dict[tuple, Req]:
        out: dict[tuple, Req] = {}
        for r in reqs:
            key = (r.name, r.group, r.marker)
            if key in out:  # the same line twice: merge the specifiers
                prev = out[key]
                spec = ",".join(sorted(set(filter(None, (prev.spec + "," + r.spec).split(",")))))
                out[key] = Req(r.name, r.group, r.marker, spec, sorted(set(prev.extras) | set(r.extras)))
            else:
                out[key] = r
        return out

    a, b = index(old), index(new)
    added = [b[k] for k in b.keys() - a.keys()]
    removed = [a[k] for k in a.keys() - b.keys()]
    changed: list[DependencyChange] = []
    for k in a.keys() & b.keys():
        x, y = a[k], b[k]
        if (x.spec, x.extras) != (y.spec, y.extras):
            changed.append(_dep_change(x, y, watch))
    # A marker edit reads as remove + add of the same (name, group): pair them up.
    by_ng_add: dict[tuple, list[Req]] = {}
    for r in added:
        by_ng_add.setdefault((r.name, r.group), []).append(r)
    by_ng_rem: dict[tuple, list[Req]] = {}
    for r in removed:
        by_ng_rem.setdefault((r.name, r.group), []).append(r)
    for ng in set(by_ng_add) & set(by_ng_rem):
        if len(by_ng_add[ng]) == 1 and len(by_ng_rem[ng]) == 1:
            x, y = by_ng_rem[ng][0], by_ng_add[ng][0]
            changed.append(_dep_change(x, y, watch))
            added.remove(y)
            removed.remove(x)
    drift.added = [DependencyChange(name=r.name, group=r.group, change="added", new=r.spec, new_marker=r.marker,
                                    new_extras=r.extras, attention=watch.watches_dep(r.name)) for r in added]
    drift.removed = [DependencyChange(name=r.name, group=r.group, change="removed", old=r.spec,
                                      old_marker=r.marker, old_extras=r.extras,
                                      attention=watch.watches_dep(r.name)) for r in removed]
    drift.changed = changed
    for lst in (drift.added, drift.removed, drift.changed):
        lst.sort(key=lambda c: (not c.attention, c.group is not None, c.group or "", c.name, c.old_marker or ""))
    return drift


def _dep_change(x: Req, y: Req, watch: WatchConfig) -> DependencyChange:
    parts = []
    if x.spec != y.spec:
        parts.append(_spec_detail(x.spec, y.spec) or f"{x.spec or 'any'} -> {y.spec or 'any'}")
    if x.extras != y.extras:
        parts.append(f"extras [{','.join(x.extras)}] -> [{','.join(y.extras)}]")
    if x.marker != y.marker:
        parts.append("marker changed")
    return DependencyChange(name=x.name, group=x.group, change="changed", old=x.spec, new=y.spec,
                            old_marker=x.marker, new_marker=y.marker, old_extras=x.extras, new_extras=y.extras,
                            detail="; ".join(parts), attention=watch.watches_dep(x.name))


def runtime_target_drift(patches: Iterable[Any], pin: TreeLike, candidate: TreeLike) -> list[RuntimeTargetChange]:
    """For every runtime edit: does its target exist on the candidate, and did its signature change?"""
    return _runtime_targets(patches, Source(pin), Source(candidate))


def _runtime_targets(patches: Iterable[Any], ps: Source, cs: Source,
                     candidate_read: Any = None) -> list[RuntimeTargetChange]:
    out: list[RuntimeTargetChange] = []
    for patch in patches:
        for edit in getattr(patch, "runtime", None) or []:
            out.append(_check_target(patch.id, edit, ps, cs, candidate_read))
    return out


def _check_target(patch_id: str, edit: Any, ps: Source, cs: Source,
                  candidate_read: Any = None) -> RuntimeTargetChange:
    target: str = edit.target
    # Keyword arguments of RuntimeTargetChange, which validates them.
    base: dict[str, Any] = dict(patch=patch_id, edit=edit.name, target=target, required=getattr(edit, "required", True),
                declared_signature=getattr(edit, "signature", None))
    module = target.partition(":")[0]
    if module.split(".")[0] != "vllm":
        return RuntimeTargetChange(**base, status="unchecked", note="target is outside vllm; not in the trees")
    pst, pt = find_target(ps, target)
    cst, ct = find_target(cs, target)
    either = ct or pt  # the kind on the candidate, else on the pin
    fields: dict[str, Any] = dict(pin_signature=pt.signature if pt else None,
                                  candidate_signature=ct.signature if ct else None,
                                  pin_location=pt.location if pt else None,
                                  candidate_location=ct.location if ct else None,
                                  kind=either.kind if either else None)
    if ct is None:  # cst != "ok"
        note = {"module_missing": f"module {module} does not exist on the candidate",
                "unparsable": f"module {module} cannot be parsed on the candidate",
                "missing": f"{target.partition(':')[2]} not found in {module} on the candidate"}[cst]
        if pt is not None:  # pst == "ok"
            note += f" (it was at {pt.location} on the pin)"
        return RuntimeTargetChange(**base, **fields, status=cst, note=note)
    notes = []
    status: RuntimeStatus = "ok"
    if pt is None:  # pst != "ok"
        notes.append("not found on the pin; new on the candidate")
    elif pt.params is not None and ct.params is not None and pt.signature != ct.signature:
        status = "signature_changed"
        notes.append("parameters changed" if pt.params != ct.params else "annotations or defaults changed")
    elif (pt.params is None) != (ct.params is None):
        status = "signature_changed"
        notes.append(f"changed from {pt.kind} to {ct.kind}")
    # The declared signature/source hash is judged by the one binding check
    # that apply, the preflight and the running process share, on the text the
    # process would run: the candidate as the plan's text patches leave it
    # (``candidate_read``), never the pristine file when a text patch edits it.
    from ..binding import check_binding

    verdict, reason, _ = check_binding(edit, candidate_read or cs.tree.read_text)
    if verdict != "applies":
        status = "signature_changed"
        notes.append(f"binding check: {reason}")
    return RuntimeTargetChange(**base, **fields, status=status, note="; ".join(notes))


# ============================================================================ compare


def compare_config(pin: TreeLike, candidate: TreeLike, watch: WatchConfig | None = None,
                   patches: Iterable[Any] | None = None, candidate_read: Any = None) -> ConfigDrift:
    """Dependency, env-default and engine-argument drift from ``pin`` to ``candidate``.

    Pure (the contract of sndr/plan.py): it reads the two tree views and returns a
    value. ``patches`` (optional) adds the runtime-target check; ``candidate_read``
    reads the candidate as the text patches leave it (the binding check's input).
    """
    watch = watch or WatchConfig()
    ps, cs = Source(pin), Source(candidate)
    runtime = _runtime_targets(patches, ps, cs, candidate_read) if patches is not None else []
    return ConfigDrift(
        pin=_version(pin),
        candidate=_version(candidate),
        watch_source=watch.source,
        dependencies=_compare_dependencies(pin, candidate, watch),
        env=_compare_env(ps, cs, watch),
        engine_args=_compare_engine_args(ps, cs, watch),
        runtime_targets=runtime,
    )


def _version(tree: TreeLike) -> str:
    try:
        return str(getattr(tree, "version", "") or "")
    except SndrError:  # an unversioned checkout still has config to compare
        return str(getattr(tree, "spec", "") or "")
