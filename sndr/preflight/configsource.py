"""Static reading of a vLLM tree's configuration surfaces (``ast`` and wheel METADATA, never an import).

One :class:`Source` per tree parses its modules on demand and resolves names
across imports; the readers on it extract one surface each:

* :func:`env_registry` - ``vllm/envs.py``'s ``environment_variables`` and their getenv defaults;
* :func:`engine_args` - ``EngineArgs`` fields, defaults resolved to the config classes they name;
* :func:`dependencies` - the requirements, from wheel METADATA or ``requirements/*.txt``;
* :func:`find_target` - a runtime edit's ``module:qualname`` and its signature.

:mod:`.configdrift` compares what these return between two trees.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..errors import SndrError
from .configmodels import TreeLike

ENVS_FILE = "vllm/envs.py"
ARG_UTILS_FILE = "vllm/engine/arg_utils.py"
ENGINE_ARGS_CLASS = "EngineArgs"
# Requirement files probed on a source tree whose view cannot list non-.py files.
_REQUIREMENT_FILES = (
    "common", "cuda", "rocm", "rocm-build", "cpu", "cpu-build", "xpu", "tpu", "hpu", "neuron",
    "build", "test", "dev", "lint", "docs", "kv_connectors", "nightly_torch_test",
)


# ============================================================================ static source


@dataclass
class Found:
    module: str
    rel: str
    node: ast.AST


class Source:
    """Parsed modules of one tree, with static name resolution across imports."""

    def __init__(self, tree: TreeLike):
        self.tree = tree
        self._parsed: dict[str, ast.Module | None] = {}
        self.errors: dict[str, str] = {}
        self._files: set[str] | None
        try:
            self._files = set(tree.files())
        except Exception:  # a view without a listing still answers read_text
            self._files = None

    def _exists(self, rel: str) -> bool:
        if self._files is not None:
            return rel in self._files
        return self.tree.read_text(rel) is not None

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if self._exists(rel):
                return rel
        return None

    def parse(self, rel: str) -> ast.Module | None:
        if rel not in self._parsed:
            mod = None
            try:
                text = self.tree.read_text(rel)
            except SndrError as exc:
                text = None
                self.errors[rel] = exc.render()
            if text is not None:
                try:
                    mod = ast.parse(text, filename=rel)
                except SyntaxError as exc:
                    self.errors[rel] = f"{rel}:{exc.lineno}: cannot parse ({exc.msg})"
            self._parsed[rel] = mod
        return self._parsed[rel]

    def parse_module(self, module: str) -> tuple[str, ast.Module] | None:
        rel = self.module_file(module)
        if rel is None:
            return None
        mod = self.parse(rel)
        return (rel, mod) if mod is not None else None

    def resolve(self, module: str, name: str, depth: int = 0) -> Found | None:
        """Find the class, function or assignment that ``name`` means in ``module``."""
        if depth > 12:
            return None
        got = self.parse_module(module)
        if got is None:
            return None
        rel, mod = got
        is_pkg = rel.endswith("/__init__.py")
        found: Found | None = None
        for stmt in _top_level(mod.body):
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return Found(module, rel, stmt)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                found = found or Found(module, rel, stmt)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                if stmt.value is not None:
                    found = found or Found(module, rel, stmt)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name and alias.name != "*":
                        src = _import_base(module, is_pkg, stmt)
                        if src is None:
                            continue
                        hit = self.resolve(src, alias.name, depth + 1)
                        if hit is None and self.module_file(f"{src}.{alias.name}"):
                            return None  # a submodule, not an attribute
                        if hit is not None:
                            return hit
        return found

    def class_member(self, found: Found, attr: str, depth: int = 0) -> Found | None:
        """``attr`` in a class body, or in its statically resolvable bases."""
        cls = found.node
        if not isinstance(cls, ast.ClassDef) or depth > 8:
            return None
        for stmt in _top_level(cls.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == attr:
                return Found(found.module, found.rel, stmt)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
                return Found(found.module, found.rel, stmt)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
                return Found(found.module, found.rel, stmt)
        for base in cls.bases:
            b = self.resolve_expr_class(found.module, base)
            if b is not None:
                hit = self.class_member(b, attr, depth + 1)
                if hit is not None:
                    return hit
        return None

    def resolve_expr_class(self, module: str, expr: ast.AST) -> Found | None:
        if isinstance(expr, ast.Name):
            hit = self.resolve(module, expr.id)
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            # ``pkg.Class`` where pkg is ``import a.b as pkg`` is rare in vLLM configs
            hit = None
        else:
            hit = None
        return hit if hit is not None and isinstance(hit.node, ast.ClassDef) else None


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements of a module or class body, looking into if/try blocks."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for h in stmt.handlers:
                yield from _top_level(h.body)
            yield from _top_level(stmt.orelse)
        else:
            yield stmt


def _import_base(module: str, is_pkg: bool, stmt: ast.ImportFrom) -> str | None:
    if not stmt.level:
        return stmt.module
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if stmt.level > 1:
        parts = parts[: len(parts) - (stmt.level - 1)]
    if not parts:
        return None
    return ".".join(parts + ([stmt.module] if stmt.module else []))


def _unparse(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


# ============================================================================ env registry


@dataclass
class EnvVar:
    name: str
    expr: str
    default: str | None
    annotated: str | None


_GETENV_FUNCS = {"getenv", "get"}  # os.getenv(...), os.environ.get(...)


def env_registry(src: Source) -> tuple[dict[str, EnvVar] | None, list[str]]:
    notes: list[str] = []
    mod = src.parse(ENVS_FILE)
    if mod is None:
        why = src.errors.get(ENVS_FILE) or f"{ENVS_FILE} not found"
        return None, [why]
    annotated: dict[str, str] = {}
    for stmt in mod.body:
        if isinstance(stmt, ast.If) and _unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for s in stmt.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None:
                    annotated[s.target.id] = ast.unparse(s.value)
    functions = {s.name: s for s in mod.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    entries: dict[str, ast.AST] = {}
    found = False
    for stmt in mod.body:
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(value, ast.Dict):
            found = True
            for k, v in zip(value.keys, value.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    entries[k.value] = v
                elif k is None:
                    notes.append(f"{ENVS_FILE}:{v.lineno}: a '**' expansion in environment_variables is not followed")
        elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
              and target.value.id == "environment_variables" and isinstance(target.slice, ast.Constant)
              and isinstance(target.slice.value, str) and value is not None):
            entries[target.slice.value] = value
    if not found:
        return None, [f"{ENVS_FILE}: no 'environment_variables = {{...}}' dict literal found"]
    out: dict[str, EnvVar] = {}
    for name, node in entries.items():
        default = _env_default(name, node)
        if default is None and isinstance(node, ast.Name) and node.id in functions:
            # ``"VLLM_PORT": get_vllm_port``: read the getter's body instead.
            default = _env_default(name, functions[node.id])
        out[name] = EnvVar(name, ast.unparse(node), default, annotated.get(name))
    return out, notes


def _env_default(name: str, node: ast.AST) -> str | None:
    """The default of the first getenv-like call that reads ``name`` (source order)."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and n.args
             and isinstance(n.args[0], ast.Constant) and n.args[0].value == name]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        if len(call.args) >= 2:
            return ast.unparse(call.args[1])
        for kw in call.keywords:
            if kw.arg in ("default", "default_value"):
                return ast.unparse(kw.value)
        if _call_name(call) in _GETENV_FUNCS:
            return "None"
    return None


# ============================================================================ engine args


@dataclass
class Arg:
    name: str
    type: str | None
    expr: str | None  # None: no default (a required field)
    value: str | None
    resolved: bool


_FIELD_FUNCS = {"field", "Field"}
_NO_DEFAULT = "<required>"


class _Resolver:
    """Resolve an EngineArgs default to the config-class default it refers to."""

    def __init__(self, src: Source):
        self.src = src

    def value(self, module: str, node: ast.AST | None, depth: int = 0) -> tuple[str, bool]:
        if node is None:
            return _NO_DEFAULT, True
        if depth > 10:
            return ast.unparse(node), False
        if isinstance(node, ast.Call) and _call_name(node) in _FIELD_FUNCS:
            for kw in node.keywords:
                if kw.arg == "default":
                    return self.value(module, kw.value, depth + 1)
                if kw.arg == "default_factory":
                    return f"default_factory={ast.unparse(kw.value)}", True
            if _call_name(node) == "Field" and node.args:
                return self.value(module, node.args[0], depth + 1)
            return _NO_DEFAULT, True
        if (isinstance(node, ast.Call) and _call_name(node) == "get_field" and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            cls = self.src.resolve_expr_class(module, node.args[0])
            if cls is not None:
                member = self.src.class_member(cls, node.args[1].value)
                if member is not None and isinstance(member.node, ast.AnnAssign):
                    return self.value(member.module, member.node.value, depth + 1)
            return ast.unparse(node), False
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            cls = self.src.resolve_expr_class(module, node.value)
            if cls is not None:
                member = self.src.class_member(cls, node.attr)
                # A dataclass field resolves to its default; an enum member
                # (plain assignment) stays readable as ``Enum.MEMBER``.
                if member is not None and isinstance(member.node, ast.AnnAssign):
                    return self.value(member.module, member.node.value, depth + 1)
                if member is not None:
                    return ast.unparse(node), True
            return ast.unparse(node), _is_literal(node)
        if isinstance(node, ast.Name) and node.id not in ("None", "True", "False"):
            hit = self.src.resolve(module, node.id)
            if hit is not None and isinstance(hit.node, (ast.Assign, ast.AnnAssign)) and hit.node.value is not None:
                if _is_literal(hit.node.value):
                    return ast.unparse(hit.node.value), True
            return node.id, False
        return ast.unparse(node), _is_literal(node)


def _is_literal(node: ast.AST) -> bool:
    """A literal, or arithmetic on literals (``32 * 1024 * 1024``): a value, not a reference."""
    if all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple,
                          ast.List, ast.Set, ast.Dict, ast.expr_context)) for n in ast.walk(node)):
        return True
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def engine_args(src: Source) -> tuple[dict[str, Arg] | None, list[str]]:
    mod = src.parse(ARG_UTILS_FILE)
    if mod is None:
        return None, [src.errors.get(ARG_UTILS_FILE) or f"{ARG_UTILS_FILE} not found"]
    cls = next((s for s in mod.body if isinstance(s, ast.ClassDef) and s.name == ENGINE_ARGS_CLASS), None)
    if cls is None:
        return None, [f"{ARG_UTILS_FILE}: class {ENGINE_ARGS_CLASS} not found"]
    module = "vllm.engine.arg_utils"
    resolver = _Resolver(src)
    out: dict[str, Arg] = {}
    unresolved: list[str] = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = ast.unparse(stmt.annotation)
        if ann.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value, ok = resolver.value(module, stmt.value)
        name = stmt.target.id
        out[name] = Arg(name, ann, _unparse(stmt.value), value, ok)
        if not ok:
            unresolved.append(name)
    notes: list[str] = []
    if unresolved:
        notes.append(f"{len(unresolved)} default(s) kept as expressions (not statically resolvable): "
                     + ", ".join(unresolved[:8]) + (" ..." if len(unresolved) > 8 else ""))
    notes.extend(src.errors.values())
    return out, notes


def config_layout(src: Source) -> str | None:
    if src.module_file("vllm.config") == "vllm/config.py":
        return "module vllm/config.py"
    if src.module_file("vllm.config") == "vllm/config/__init__.py":
        return "package vllm/config/"
    return None


# ============================================================================ dependencies


@dataclass
class Req:
    name: str
    group: str | None
    marker: str | None
    spec: str
    extras: list[str]


_EXTRA_RE = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _split_extra(marker: str | None) -> tuple[str | None, str | None]:
    if not marker:
        return None, None
    m = _EXTRA_RE.search(marker)
    if m is None:
        return None, marker
    rest = (marker[: m.start()] + marker[m.end():]).strip()
    rest = re.sub(r"^(and|or)\s+|\s+(and|or)$", "", rest).strip()
    while rest.startswith("(") and rest.endswith(")") and rest.count("(") == 1:
        rest = rest[1:-1].strip()
    return canonicalize_name(m.group(1)), rest or None


def _parse_requirement(line: str, group: str | None, notes: list[str], where: str) -> Req | None:
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        notes.append(f"{where}: cannot parse {line!r} ({exc})")
        return None
    extra, marker = _split_extra(str(req.marker) if req.marker else None)
    return Req(canonicalize_name(req.name), extra if extra is not None else group, marker,
                ",".join(sorted(str(s) for s in req.specifier)), sorted(req.extras))


def dependencies(tree: TreeLike) -> tuple[list[Req] | None, str, list[str]]:
    notes: list[str] = []
    meta = None
    try:
        meta = tree.metadata()
    except Exception as exc:  # a view that cannot read its metadata degrades, not fails
        notes.append(f"cannot read wheel METADATA: {exc}")
    if meta:
        reqs = []
        for line in meta.splitlines():
            if line.startswith("Requires-Dist:"):
                r = _parse_requirement(line.split(":", 1)[1].strip(), None, notes, "METADATA")
                if r:
                    reqs.append(r)
        return reqs, "wheel METADATA", notes
    files = _requirement_files(tree)
    if not files:
        notes.append("no wheel METADATA and no requirements/*.txt in this tree (a wheel tree without its "
                     "dist-info, or a bare vllm/ directory)")
        return None, "none", notes
    reqs = []
    for rel, text in files:
        stem = Path(rel).stem
        group = None if stem in ("common", "requirements") else stem
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith(("#", "-", "git+", "http:", "https:")):
                continue
            r = _parse_requirement(line, group, notes, f"{rel}:{n}")
            if r:
                reqs.append(r)
    return reqs, "requirements/*.txt", notes


def _requirement_files(tree: TreeLike) -> list[tuple[str, str]]:
    # Tree views list .py files only; a directory's listing adds names the probe list lacks.
    rels = {f"requirements/{s}.txt" for s in _REQUIREMENT_FILES}
    root = getattr(tree, "root", None)
    if isinstance(root, Path) and (root / "requirements").is_dir():
        rels |= {f"requirements/{p.name}" for p in (root / "requirements").glob("*.txt")}
    out = []
    for rel in sorted(rels):
        text = _read(tree, rel)
        if text is not None:
            out.append((rel, text))
    return out


def _read(tree: TreeLike, rel: str) -> str | None:
    try:
        return tree.read_text(rel)
    except SndrError:  # not UTF-8: treat as unreadable, the caller notes what it could not use
        return None


# ============================================================================ runtime targets


@dataclass
class Target:
    kind: str
    signature: str | None
    params: tuple | None
    location: str


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, tuple]:
    text = f"({ast.unparse(fn.args)})"
    if fn.returns is not None:
        text += f" -> {ast.unparse(fn.returns)}"
    a = fn.args
    params = tuple(
        [("posonly", p.arg) for p in a.posonlyargs] + [("pos", p.arg) for p in a.args]
        + ([("*", a.vararg.arg)] if a.vararg else []) + [("kw", p.arg) for p in a.kwonlyargs]
        + ([("**", a.kwarg.arg)] if a.kwarg else []))
    return text, params


def _describe(found: Found, in_class: bool) -> Target:
    node = found.node
    loc = f"{found.rel}:{getattr(node, 'lineno', '?')}"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        decos = {_call_name(d) for d in node.decorator_list}
        kind = "property" if "property" in decos or "cached_property" in decos else (
            "method" if in_class else "function")
        sig, params = _signature(node)
        return Target(kind, sig, params, loc)
    if isinstance(node, ast.ClassDef):
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is not None:
            sig, params = _signature(init)
            return Target("class", sig, params, loc)
        return Target("class", None, None, loc)
    return Target("attribute", None, None, loc)


#: What :func:`find_target` can say; the target is not None exactly when it says "ok".
FindStatus = Literal["ok", "missing", "module_missing", "unparsable"]


def find_target(src: Source, target: str) -> tuple[FindStatus, Target | None]:
    module, _, qual = target.partition(":")
    if src.module_file(module) is None:
        return "module_missing", None
    if src.parse_module(module) is None:
        return "unparsable", None
    parts = qual.split(".")
    found = src.resolve(module, parts[0])
    in_class = False
    for part in parts[1:]:
        if found is None:
            break
        found = src.class_member(found, part)
        in_class = True
    if found is None:
        return "missing", None
    return "ok", _describe(found, in_class)
