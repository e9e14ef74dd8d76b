"""``python -m sndr import genesis SRC --to DIR``: the seed system's text patchers become patch files.

The seed system (``Sandermage/sndr_core_engine``) keeps each text patch as a Python module built on
``TextPatcher`` / ``TextPatch`` sub-patches, and its metadata in ``sndr/dispatcher/registry.py``
(``PATCH_REGISTRY``). This converter reads both **statically** (``ast``; nothing is imported or
executed):

* a string is what a constant, a ``+`` of strings, implicit concatenation, ``str.replace`` /
  ``strip`` / ``join`` / ``textwrap.dedent`` on such strings, or a module-level name bound once
  to one of those evaluates to; ``resolve_vllm_file("x")`` is ``vllm/x``; ``sub_patches`` may be a
  list or a call of a module function that returns one;
* a ``TextPatch`` is an edit (``required`` defaults to false, as in the seed), its
  ``upstream_merged_markers`` its merged markers; a ``TextPatcher``'s ``upstream_drift_markers``
  are the merged markers of its file;
* the registry entry gives the id, title, description (``credit``), ``default`` (``default_on``),
  ``lifecycle`` (retired/legacy -> retired; stable -> active; the rest experimental), ``upstream``,
  ``requires``, ``conflicts``, ``vllm`` (``vllm_version_range``) and ``when`` (``applies_to``: the keys
  sndr has); every patch is best-effort, ``on_failure = "skip"``, as the seed applies it;
* the boot order (registry order, ``requires_patches`` first, as the seed's topological sort) becomes
  ``after``: each patch follows the previous patch of the boot order on each file it touches.

Everything it cannot express is reported with the file and line (a name bound under a condition,
an f-string, a dynamic patcher, an ``applies_to`` key sndr lacks, a requires on a patch not
imported, ...): an optional edit it cannot read is left out of its patch; a patch whose required
edit it cannot read is not written.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

REGISTRY = "sndr/dispatcher/registry.py"
_WHEN_KEYS = {"model_arch", "model_class", "is_hybrid", "quant_format", "tool_call_parser", "spec_method",
              "kv_cache_dtype", "platform", "quantization"}
_LIFECYCLE = {"retired": "retired", "legacy": "retired", "stable": "active"}


class Unsupported(Exception):
    def __init__(self, what: str, node: ast.AST | None = None):
        super().__init__(what)
        self.what = what
        self.line = getattr(node, "lineno", None)


@dataclass
class Note:
    """A construct the converter cannot express: where it is and what it is."""

    file: str
    line: int | None
    what: str
    patch: str = ""


@dataclass
class GenesisResult:
    patches: list = field(default_factory=list)  # sndr.model.Patch, in boot order
    notes: list[Note] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # registry id -> why no patch file

    def to_json(self) -> dict:
        return {"patches": [p.id for p in self.patches], "skipped": self.skipped,
                "notes": [asdict(n) for n in self.notes]}


class _Module:
    """Static evaluation of one Python module's string constants."""

    def __init__(self, path: Path, rel: str, exists=None):
        self.rel = rel
        #: ``exists(rel) -> bool`` on the tree the patches are for: picks among path alternatives.
        self.exists = exists
        #: Choices made where the seed decides at run time (path alternatives): (line, what).
        self.choices: list[tuple[int | None, str]] = []
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        self.names: dict[str, ast.AST] = {}
        self.conditional: dict[str, int] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        for node in self.tree.body:
            self._collect(node, top=True)
        self._memo: dict[str, object] = {}

    def _collect(self, node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.FunctionDef):
            if top:
                self.functions[node.name] = node
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and node.value is not None:
                    if not top or t.id in self.names:
                        self.conditional.setdefault(t.id, node.lineno)
                    else:
                        self.names[t.id] = node.value
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self._collect(child, top=False)

    def value(self, node: ast.AST, local: dict[str, ast.AST] | None = None, depth: int = 0):
        if depth > 50:
            raise Unsupported("expression nested too deep", node)
        local = local or {}
        ev = lambda n: self.value(n, local, depth + 1)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return self._fstring(node, local, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = ev(node.left), ev(node.right)
            if type(left) is not type(right) or not isinstance(left, (str, list)):
                raise Unsupported("a '+' of values that are not both strings", node)
            return left + right
        if isinstance(node, (ast.List, ast.Tuple)):
            out: list = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    got = ev(e.value)
                    if not isinstance(got, list):
                        raise Unsupported("a *spread of something that is not a list", e)
                    out += got
                else:
                    out.append(ev(e))
            return out
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            return self._alternatives([ev(v) for v in node.values], node)
        if isinstance(node, ast.Name):
            if node.id in local:
                return ev(local[node.id])
            if node.id in self.conditional:
                raise Unsupported(f"{node.id} is bound under a condition (line {self.conditional[node.id]}): "
                                  "its value is decided at run time", node)
            if node.id in self.names:
                if node.id not in self._memo:
                    self._memo[node.id] = ev(self.names[node.id])
                return self._memo[node.id]
            raise Unsupported(f"{node.id} is not a module-level constant here (imported or computed)", node)
        if isinstance(node, ast.Call):
            return self._call(node, local, depth)
        raise Unsupported(f"a {type(node).__name__} expression", node)

    def _fstring(self, node: ast.JoinedStr, local, depth: int) -> str:
        """An f-string whose every field is a constant this module defines (else it depends on run time)."""
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
                continue
            if not isinstance(part, ast.FormattedValue):
                raise Unsupported("an f-string part sndr cannot read", part)
            try:
                value = self.value(part.value, local, depth + 1)
            except Unsupported as exc:
                raise Unsupported(f"an f-string with a field known only at run time ({exc.what})", part) from None
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise Unsupported("an f-string field that is not a string or a number", part)
            shown: object = value
            if part.conversion == 114:
                shown = repr(value)
            elif part.conversion == 97:
                shown = ascii(value)
            elif part.conversion == 115:
                shown = str(value)
            spec = self.value(part.format_spec, local, depth + 1) if part.format_spec is not None else ""
            out.append(format(shown, str(spec)))
        return "".join(out)

    def _call(self, node: ast.Call, local, depth: int):
        ev = lambda n: self.value(n, local, depth + 1)  # noqa: E731
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name == "resolve_vllm_file" and len(node.args) == 1:
            rel = ev(node.args[0])
            if not isinstance(rel, str):
                raise Unsupported("resolve_vllm_file of a non-string", node)
            return "vllm/" + rel.lstrip("/")
        if name == "repr" and len(node.args) == 1 and isinstance(f, ast.Name):
            got = ev(node.args[0])
            if not isinstance(got, (str, int, float)):
                raise Unsupported("repr() of something that is not a string or a number", node)
            return repr(got)
        if name in ("str", "list", "tuple") and len(node.args) == 1 and isinstance(f, ast.Name):
            got = ev(node.args[0])
            if name != "str" and not isinstance(got, list):
                raise Unsupported(f"{name}() of something that is not a list", node)
            return got
        if name == "dedent" and len(node.args) == 1:
            return textwrap.dedent(ev(node.args[0]))
        if isinstance(f, ast.Attribute):
            obj = ev(f.value)
            args = [ev(a) for a in node.args]
            if isinstance(obj, str) and name in ("replace", "strip", "lstrip", "rstrip", "join") and not node.keywords:
                if name == "join":
                    if len(args) != 1 or not isinstance(args[0], list) or not all(isinstance(x, str) for x in args[0]):
                        raise Unsupported("str.join of something other than a list of strings", node)
                if not all(isinstance(a, (str, int)) for a in args if not isinstance(a, list)):
                    raise Unsupported(f"str.{name} with non-constant arguments", node)
                return getattr(obj, name)(*args)
        if isinstance(f, ast.Name) and f.id in self.functions and not node.args and not node.keywords:
            return self.returned(self.functions[f.id])
        raise Unsupported(f"a call of {name or 'an expression'}()", node)

    def _alternatives(self, values: list, node: ast.AST):
        """``a or b``: the seed takes the first that exists at run time. For vLLM paths, the first the
        tree has (or the first, without a tree); said in the report either way."""
        if not all(isinstance(v, str) and v.startswith("vllm/") for v in values if v is not None):
            raise Unsupported("an 'or' of values other than vLLM paths", node)
        paths = [v for v in values if v]
        if not paths:
            raise Unsupported("an 'or' of no path", node)
        chosen = next((v for v in paths if self.exists is not None and self.exists(v)), paths[0])
        how = "the first the tree has" if self.exists is not None and self.exists(chosen) else "the first"
        self.choices.append((getattr(node, "lineno", None),
                             f"one of {', '.join(paths)} at run time; took {chosen} ({how})"))
        return chosen

    def bound_params(self, fn: ast.FunctionDef) -> dict[str, ast.AST]:
        """A factory's parameters, bound from its one call site in this module (``f(x)`` -> ``{param: x}``)."""
        params = [a.arg for a in fn.args.args]
        if not params:
            return {}
        for caller in ast.walk(self.tree):
            if not isinstance(caller, (ast.FunctionDef, ast.AsyncFunctionDef)) or caller is fn:
                continue
            local: dict[str, ast.AST] = {}
            for stmt in caller.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    local[stmt.targets[0].id] = stmt.value
            for call in ast.walk(caller):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == fn.name \
                        and len(call.args) == len(params) and not call.keywords:
                    try:
                        return {p: ast.Constant(self.value(a, local)) for p, a in zip(params, call.args)}
                    except Unsupported:
                        continue
        return {}

    def returned(self, fn: ast.FunctionDef):
        """What a module function returns, when it is one unconditional ``return`` after simple assignments."""
        local: dict[str, ast.AST] = {}
        for stmt in fn.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # the docstring
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                local[stmt.targets[0].id] = stmt.value
                continue
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                return self.value(stmt.value, local)
            raise Unsupported(f"{fn.name}() is not one return after simple assignments", stmt)
        raise Unsupported(f"{fn.name}() returns nothing", fn)

    def patchers(self) -> list[tuple[ast.Call, dict[str, ast.AST]]]:
        """Every ``TextPatcher(...)`` call, with the simple assignments of its function before it."""
        out = []
        scopes: list[tuple[list[ast.stmt], dict]] = [(self.tree.body, {})]
        scopes += [(fn.body, self.bound_params(fn)) for fn in ast.walk(self.tree)
                   if isinstance(fn, ast.FunctionDef)]
        seen: set[int] = set()
        for body, params in scopes:
            local: dict[str, ast.AST] = dict(params)
            nested = _nested_assignments(body) if body is not self.tree.body else {}
            for stmt in body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    local[stmt.targets[0].id] = stmt.value
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                for name, value in nested.items():  # bound only inside a block (`if target is None: ...`)
                    local.setdefault(name, value)
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and _callee(node) == "TextPatcher" and id(node) not in seen:
                        seen.add(id(node))
                        out.append((node, dict(local)))
        return out


def _nested_assignments(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """``name = value`` statements inside the blocks (if/with/try) of a function body, for names bound exactly
    once there (``if target is None: target = ...``); a name with alternative bindings is left unbound."""
    seen: dict[str, list[ast.AST]] = {}
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.With, ast.Try)):
            for node in ast.walk(stmt):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    seen.setdefault(node.targets[0].id, []).append(node.value)
    return {name: values[0] for name, values in seen.items() if len(values) == 1}


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _kw(node: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _edit_name(raw: str, used: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", raw or "edit")
    if not re.match(r"^[A-Za-z]", name):
        name = "e_" + name
    base, n = name, 2
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def boot_order(registry: dict[str, dict]) -> list[str]:
    """Registry order with every ``requires_patches`` first (the seed's own topological sort)."""
    order: list[str] = []
    done: set[str] = set()

    def visit(pid: str, stack: tuple[str, ...] = ()) -> None:
        if pid in done or pid in stack:
            return
        for r in registry[pid].get("requires_patches") or []:
            if r in registry:
                visit(r, (*stack, pid))
        done.add(pid)
        order.append(pid)

    for pid in registry:
        visit(pid)
    return order


def read_registry(src: Path) -> tuple[dict[str, dict], dict[str, int]]:
    path = src / REGISTRY
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=REGISTRY)
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        value = node.value
        if isinstance(target, ast.Name) and target.id == "PATCH_REGISTRY" and isinstance(value, ast.Dict):
            reg: dict[str, dict] = {}
            lines: dict[str, int] = {}
            for k, v in zip(value.keys, value.values):
                key = ast.literal_eval(k) if k is not None else None
                try:
                    meta = ast.literal_eval(v)
                except ValueError:
                    continue
                if isinstance(key, str) and isinstance(meta, dict):
                    reg[key], lines[key] = meta, v.lineno
            return reg, lines
    raise ValueError(f"{REGISTRY}: no PATCH_REGISTRY = {{...}} literal")


def convert(src: Path, exists=None) -> GenesisResult:
    """The patch set of a seed-system checkout at ``src`` (its root), and what could not be expressed.

    ``exists(rel)``: whether the tree the patches are for has a file (picks among path alternatives).
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from pydantic import ValidationError

    from ..model import Patch

    res = GenesisResult()
    registry, reg_lines = read_registry(src)
    order = boot_order(registry)
    modules: dict[str, str] = {}  # apply_module -> the first id that claims it
    files_of: dict[str, list[dict]] = {}
    for pid in order:
        meta = registry[pid]
        mod = meta.get("apply_module")
        if not mod:
            res.skipped[pid] = "no apply_module (not a code patch)"
            continue
        if mod in modules:
            res.skipped[pid] = f"shares apply_module {mod} with {modules[mod]}, which carries its edits"
            continue
        modules[mod] = pid
        rel = mod.replace(".", "/") + ".py"
        path = src / rel
        if not path.is_file():
            res.skipped[pid] = f"apply_module {mod} has no file {rel}"
            continue
        try:
            module = _Module(path, rel, exists)
        except SyntaxError as exc:
            res.notes.append(Note(rel, exc.lineno, f"does not parse: {exc.msg}", pid))
            res.skipped[pid] = f"{rel} does not parse"
            continue
        entries, why = _files_of(module, pid, res.notes)
        if why:
            res.skipped[pid] = why
            continue
        files_of[pid] = entries
    imported = [pid for pid in order if pid in files_of]
    last_on: dict[str, str] = {}
    for pid in imported:
        meta = registry[pid]
        where = f"{REGISTRY}"
        line = reg_lines.get(pid)
        after = sorted({last_on[f["path"]] for f in files_of[pid] if f["path"] in last_on})
        requires = _known(meta.get("requires_patches"), imported, "requires_patches", pid, where, line, res.notes)
        conflicts = _known(meta.get("conflicts_with"), imported, "conflicts_with", pid, where, line, res.notes)
        after = [a for a in after if a not in requires]
        vllm = _spec(meta.get("vllm_version_range") or (meta.get("applies_to") or {}).get("vllm_version_range"))
        if vllm:
            try:
                SpecifierSet(vllm)
            except InvalidSpecifier:
                res.notes.append(Note(where, line, f"vllm_version_range {vllm!r} is not PEP 440: left out", pid))
                vllm = ""
        when = _when(meta.get("applies_to") or {}, pid, where, line, res.notes)
        upstream = [f"vllm#{meta['upstream_pr']}"] if isinstance(meta.get("upstream_pr"), int) else []
        data = {"id": pid, "title": meta.get("title") or pid, "description": str(meta.get("credit") or ""),
                "default": bool(meta.get("default_on")), "on_failure": "skip",
                "lifecycle": _LIFECYCLE.get(str(meta.get("lifecycle")), "experimental"),
                "vllm": vllm, "upstream": upstream, "requires": requires, "conflicts": conflicts, "after": after,
                "files": files_of[pid]}
        if when:
            data["when"] = when
        try:
            res.patches.append(Patch.model_validate(data))
        except ValidationError as exc:
            res.skipped[pid] = f"not a valid patch: {exc.errors()[0].get('msg')}"
            continue
        for f in files_of[pid]:
            last_on[f["path"]] = pid
    return res


def _files_of(module: _Module, pid: str, notes: list[Note]) -> tuple[list[dict], str]:
    by_path: dict[str, dict] = {}
    used: set[str] = set()
    calls = module.patchers()
    if not calls:
        return [], f"{module.rel} has no TextPatcher (a runtime or dynamic patcher)"
    failures: list[str] = []
    for call, local in calls:
        try:
            target = module.value(_kw(call, "target_file") or ast.Constant(None), local)
            if not isinstance(target, str) or not target.startswith("vllm/"):
                raise Unsupported("target_file is not resolve_vllm_file(\"...\")", call)
        except Unsupported as exc:
            # A patcher whose target its caller chooses (a test fixture, a build mode): not this patch's edits.
            notes.append(Note(module.rel, exc.line or call.lineno, f"a TextPatcher whose target is not a vLLM file "
                              f"known statically ({exc.what}): left out", pid))
            failures.append(f"{module.rel}:{exc.line or call.lineno}: {exc.what}")
            continue
        try:
            subs_node = _kw(call, "sub_patches")
            if subs_node is None:
                raise Unsupported("TextPatcher without sub_patches", call)
            subs = _sub_patches(module, subs_node, local)
            drift = _kw(call, "upstream_drift_markers")
            markers = module.value(drift, local) if drift is not None else []
        except Unsupported as exc:
            notes.append(Note(module.rel, exc.line or call.lineno, exc.what, pid))
            return [], f"{module.rel}:{exc.line or call.lineno}: {exc.what}"
        entry = by_path.setdefault(target, {"path": target, "edits": [], "merged_markers": []})
        entry["merged_markers"] += [m for m in markers if isinstance(m, str) and m.strip()
                                    and m not in entry["merged_markers"]]
        for sub in subs:
            if isinstance(sub, Unsupported):
                notes.append(Note(module.rel, sub.line, sub.what, pid))
                if getattr(sub, "required", False):
                    return [], f"{module.rel}:{sub.line}: a required edit cannot be read: {sub.what}"
                continue
            if not sub["anchor"].strip() or sub["anchor"] == sub["replacement"] or not sub["replacement"]:
                notes.append(Note(module.rel, sub["line"], f"edit {sub['name']!r}: empty or no-op anchor/replacement "
                                  "(a disabled variant)", pid))
                if sub["required"]:
                    return [], f"{module.rel}:{sub['line']}: required edit {sub['name']!r} is a no-op"
                continue
            entry["edits"].append({"name": _edit_name(sub["name"], used), "anchor": sub["anchor"],
                                   "replacement": sub["replacement"], "required": sub["required"],
                                   "merged_markers": [m for m in sub["markers"] if m.strip()]})
    notes.extend(Note(module.rel, line, what, pid) for line, what in module.choices)
    out = [e for e in by_path.values() if e["edits"]]
    if not out:
        return [], failures[0] if failures and not by_path else f"{module.rel}: no edit could be read"
    return out, ""


def _sub_patches(module: _Module, node: ast.AST, local) -> list:
    """The TextPatch calls of ``sub_patches`` (a list, or a module function returning one), each read or an
    :class:`Unsupported` (with ``required`` set when the edit was required)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in module.functions:
        fn = module.functions[node.func.id]
        rets = [s for s in fn.body if isinstance(s, ast.Return)]
        if len(rets) != 1 or not isinstance(rets[0].value, ast.List):
            raise Unsupported(f"{fn.name}() does not return one list literal", fn)
        local = dict(local)
        for s in fn.body:
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                local[s.targets[0].id] = s.value
        node = rets[0].value
    elif isinstance(node, ast.Name) and node.id in local:
        node = local[node.id]
    if not isinstance(node, ast.List):
        raise Unsupported("sub_patches is not a list of TextPatch(...)", node)
    elts: list[ast.AST] = []
    for elt in node.elts:
        if isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Name) \
                and isinstance(module.names.get(elt.value.id), ast.List) and elt.value.id not in module.conditional:
            elts += module.names[elt.value.id].elts  # type: ignore[attr-defined]
        else:
            elts.append(elt)
    out: list = []
    for item in elts:
        if not (isinstance(item, ast.Call) and _callee(item) == "TextPatch"):
            out.append(Unsupported("a sub-patch that is not a TextPatch(...) call", item))
            continue
        elt = item
        req_node = _kw(elt, "required")
        required = bool(isinstance(req_node, ast.Constant) and req_node.value)
        try:
            name = module.value(_kw(elt, "name") or ast.Constant("edit"), local)
            anchor = module.value(_kw(elt, "anchor") or ast.Constant(""), local)
            replacement = module.value(_kw(elt, "replacement") or ast.Constant(""), local)
            mk = _kw(elt, "upstream_merged_markers")
            markers = module.value(mk, local) if mk is not None else []
            if req_node is not None and not isinstance(req_node, ast.Constant):
                raise Unsupported("required= is not a constant", req_node)
            if not all(isinstance(x, str) for x in (name, anchor, replacement)):
                raise Unsupported("name, anchor or replacement is not a string", elt)
        except Unsupported as exc:
            exc.line = exc.line or elt.lineno
            exc.required = required  # type: ignore[attr-defined]
            out.append(exc)
            continue
        out.append({"name": name, "anchor": anchor, "replacement": replacement, "required": required,
                    "markers": [m for m in markers if isinstance(m, str)], "line": elt.lineno})
    return out


def _known(ids, imported: list[str], key: str, pid: str, where: str, line, notes: list[Note]) -> list[str]:
    out = []
    for i in ids or []:
        if i in imported and i != pid:
            out.append(i)
        else:
            notes.append(Note(where, line, f"{key} names {i!r}, which is not imported: left out", pid))
    return sorted(set(out), key=out.index)


def _spec(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value if v)
    return str(value or "")


def _when(applies: dict, pid: str, where: str, line, notes: list[Note]) -> dict:
    out: dict = {}
    for key, value in applies.items():
        if key == "vllm_version_range":
            continue
        if key not in _WHEN_KEYS:
            notes.append(Note(where, line, f"applies_to.{key} has no sndr `when` key: the condition is left out",
                              pid))
            continue
        values = value if isinstance(value, list) else [value]
        if key == "is_hybrid":
            if not all(isinstance(v, bool) for v in values):
                notes.append(Note(where, line, f"applies_to.is_hybrid = {value!r} is not true/false: left out", pid))
                continue
            out[key] = [("true" if v else "false") for v in values]
            continue
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            notes.append(Note(where, line, f"applies_to.{key} = {value!r} is not a list of strings: left out", pid))
            continue
        out[key] = values
    return out
