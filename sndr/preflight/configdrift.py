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

A tree is anything with ``read_text(rel) -> str | None``, ``files()``,
``metadata() -> str | None`` and ``version`` (see ``sndr.tree``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import SndrError, bad_input

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

ENVS_FILE = "vllm/envs.py"
ARG_UTILS_FILE = "vllm/engine/arg_utils.py"
ENGINE_ARGS_CLASS = "EngineArgs"
CONFIG_FILE_NAMES = ("sndr.toml", "pyproject.toml")
#: Top-level tables of sndr.toml (``[tool.sndr]`` in a pyproject) that this
#: module understands. Another module that adds a table adds its name here.
KNOWN_SECTIONS = ("watch",)
WATCH_KEYS = ("env", "engine_args", "dependencies")
# Requirement files probed on a source tree whose view cannot list non-.py files.
_REQUIREMENT_FILES = (
    "common", "cuda", "rocm", "rocm-build", "cpu", "cpu-build", "xpu", "tpu", "hpu", "neuron",
    "build", "test", "dev", "lint", "docs", "kv_connectors", "nightly_torch_test",
)


class TreeLike(Protocol):
    @property
    def version(self) -> Any: ...  # read-only, so a Snapshot's property satisfies it

    def read_text(self, rel: str) -> str | None: ...

    def files(self) -> list[str]: ...

    def metadata(self) -> str | None: ...


# ============================================================================ models


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


ChangeKind = Literal["added", "removed", "changed"]


class DependencyChange(_Model):
    """One Requires-Dist (or requirements line) that was added, removed or changed."""

    name: str = Field(description="canonical (PEP 503) distribution name")
    group: str | None = Field(default=None, description="wheel extra (e.g. 'audio'), or the requirements file stem of a "
                              "source tree; None for core dependencies")
    change: ChangeKind
    old: str | None = Field(default=None, description="old version specifier, e.g. '==2.13.0' ('' = any version)")
    new: str | None = Field(default=None, description="new version specifier")
    old_marker: str | None = Field(default=None, description="environment marker, without the extra clause")
    new_marker: str | None = None
    old_extras: list[str] = Field(default_factory=list, description="extras requested of the dependency, e.g. ['standard']")
    new_extras: list[str] = Field(default_factory=list)
    detail: str = Field(default="", description="human summary, e.g. 'pin 2.13.0 -> 2.14.0'")
    attention: bool = Field(default=False, description="matches the operator's watch config")


class EnvChange(_Model):
    """One entry of vLLM's ``environment_variables`` registry (vllm/envs.py)."""

    name: str
    change: ChangeKind
    default_changed: bool = Field(default=False, description="the default value changed, not only the parsing expression")
    old_default: str | None = Field(default=None, description="default as source text, from the os.getenv-style call")
    new_default: str | None = None
    old_expr: str | None = Field(default=None, description="the registry entry (lambda or getter) as normalised source text")
    new_expr: str | None = None
    old_annotated: str | None = Field(default=None, description="the TYPE_CHECKING annotated default, as source text")
    new_annotated: str | None = None
    attention: bool = False


class EngineArgChange(_Model):
    """One ``EngineArgs`` dataclass field added, removed or whose default changed."""

    name: str
    change: ChangeKind = Field(description="'changed' means the default changed")
    old: str | None = Field(default=None, description="default as source text, resolved through config classes where possible")
    new: str | None = None
    old_expr: str | None = Field(default=None, description="the default expression as written in EngineArgs")
    new_expr: str | None = None
    old_type: str | None = None
    new_type: str | None = None
    resolved: bool = Field(default=True, description="both defaults were resolved to a value (not only an expression)")
    attention: bool = False


class _Section(_Model):
    available: bool = True
    notes: list[str] = Field(default_factory=list)


class DependencyDrift(_Section):
    source_pin: str = Field(default="", description="'wheel METADATA', 'requirements/*.txt' or 'none'")
    source_candidate: str = ""
    added: list[DependencyChange] = Field(default_factory=list)
    removed: list[DependencyChange] = Field(default_factory=list)
    changed: list[DependencyChange] = Field(default_factory=list)


class EnvDrift(_Section):
    pin_count: int = 0
    candidate_count: int = 0
    added: list[EnvChange] = Field(default_factory=list)
    removed: list[EnvChange] = Field(default_factory=list)
    changed: list[EnvChange] = Field(default_factory=list)


class EngineArgDrift(_Section):
    pin_count: int = 0
    candidate_count: int = 0
    added: list[EngineArgChange] = Field(default_factory=list)
    removed: list[EngineArgChange] = Field(default_factory=list)
    changed: list[EngineArgChange] = Field(default_factory=list)


RuntimeStatus = Literal["ok", "missing", "module_missing", "signature_changed", "unparsable", "unchecked"]


class RuntimeTargetChange(_Model):
    """Whether a runtime patch's ``module:Qual.name`` target survives the bump."""

    patch: str
    edit: str
    target: str
    status: RuntimeStatus
    required: bool = True
    kind: str | None = Field(default=None, description="function, method, class or attribute (on the candidate, else the pin)")
    pin_signature: str | None = None
    candidate_signature: str | None = None
    declared_signature: str | None = Field(default=None, description="the signature the patch declares, if any")
    pin_location: str | None = Field(default=None, description="file:line on the pin")
    candidate_location: str | None = None
    note: str = ""

    @property
    def broken(self) -> bool:
        return self.status in ("missing", "module_missing", "signature_changed")


class ConfigDrift(_Model):
    """The configuration-drift section of a bump preflight."""

    pin: str = ""
    candidate: str = ""
    watch_source: str | None = Field(default=None, description="the config file the watch list came from")
    dependencies: DependencyDrift = Field(default_factory=DependencyDrift)
    env: EnvDrift = Field(default_factory=EnvDrift)
    engine_args: EngineArgDrift = Field(default_factory=EngineArgDrift)
    runtime_targets: list[RuntimeTargetChange] = Field(default_factory=list)
    attention_count: int = Field(default=0, description="changed items that match the watch config")
    has_attention: bool = Field(default=False, description="true when any watched item changed (--fail-on config)")

    @model_validator(mode="after")
    def _count_attention(self) -> ConfigDrift:
        n = sum(1 for item in self.items() if item.attention)
        # Derived, so it can never disagree with the lists it summarises.
        self.attention_count = n
        self.has_attention = n > 0
        return self

    def items(self) -> Iterable[DependencyChange | EnvChange | EngineArgChange]:
        for section in (self.dependencies, self.env, self.engine_args):
            yield from section.added
            yield from section.removed
            yield from section.changed

    @property
    def runtime_broken(self) -> list[RuntimeTargetChange]:
        return [r for r in self.runtime_targets if r.broken]


def json_schema() -> dict:
    return ConfigDrift.model_json_schema()


# ============================================================================ watch config


class WatchConfig(_Model):
    """What the operator watches. Names may be fnmatch globs (``VLLM_USE_FLASHINFER_*``)."""

    env: list[str] = Field(default_factory=list, description="environment variable names (case-sensitive)")
    engine_args: list[str] = Field(default_factory=list, description="EngineArgs field names; '--max-num-seqs' also accepted")
    dependencies: list[str] = Field(default_factory=list, description="distribution names, compared canonicalised")
    source: str | None = Field(default=None, description="file the config was read from")

    def watches_env(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.env)

    def watches_arg(self, name: str) -> bool:
        name = _arg_name(name)
        return any(fnmatch.fnmatchcase(name, _arg_name(pat)) for pat in self.engine_args)

    def watches_dep(self, name: str) -> bool:
        name = canonicalize_name(name)
        return any(fnmatch.fnmatchcase(name, _canon_glob(pat)) for pat in self.dependencies)


def _arg_name(name: str) -> str:
    return name.strip().lstrip("-").replace("-", "_")


def _canon_glob(pat: str) -> str:
    # canonicalize_name would mangle '*' runs; normalise the separators only.
    return re.sub(r"[-_.]+", "-", pat.strip()).lower()


def load_watch_config(path: Path | str | None = None, start: Path | str | None = None,
                      stop: Path | str | None = None) -> WatchConfig:
    """Read the watch list from ``path``, or find it upward from ``start`` (default cwd).

    At each directory, ``sndr.toml`` wins over ``pyproject.toml``; a pyproject
    without ``[tool.sndr]`` is skipped. The search ends at ``stop`` (inclusive)
    or the filesystem root. No file found means an empty watch list.
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise bad_input("config_missing", "watch config file not found", file=str(p))
        cfg = _read_config_file(p, required=True)
        return cfg if cfg is not None else WatchConfig(source=str(p))
    here = Path(start) if start is not None else Path.cwd()
    here = here.resolve()
    stop_at = Path(stop).resolve() if stop is not None else None
    for d in [here, *here.parents]:
        for fname in CONFIG_FILE_NAMES:
            cand = d / fname
            if cand.is_file():
                cfg = _read_config_file(cand, required=False)
                if cfg is not None:
                    return cfg
        if stop_at is not None and d == stop_at:
            break
    return WatchConfig()


def _read_config_file(path: Path, required: bool) -> WatchConfig | None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise bad_input("bad_toml", f"not valid TOML: {exc}", file=str(path),
                        line=int(m.group(1)) if m else None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_input("config_unreadable", f"cannot read: {exc}", file=str(path)) from None
    prefix = ""
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        if not isinstance(tool, dict) or "sndr" not in tool:
            if required:
                raise bad_input("config_missing", "no [tool.sndr] table", file=str(path), key="tool.sndr")
            return None
        data, prefix = tool["sndr"], "tool.sndr."
        if not isinstance(data, dict):
            raise bad_input("bad_config", "must be a table", file=str(path), key="tool.sndr")
    for key in data:
        if key not in KNOWN_SECTIONS:
            raise bad_input("unknown_key", f"unknown key {key!r}", file=str(path), key=prefix + key,
                            hint="known tables: " + ", ".join(f"[{prefix}{s}]" for s in KNOWN_SECTIONS))
    watch = data.get("watch", {})
    if not isinstance(watch, dict):
        raise bad_input("bad_config", "must be a table", file=str(path), key=prefix + "watch")
    values: dict[str, list[str]] = {}
    for key, val in watch.items():
        where = f"{prefix}watch.{key}"
        if key not in WATCH_KEYS:
            raise bad_input("unknown_key", f"unknown key {key!r}", file=str(path), key=where,
                            hint="valid keys: " + ", ".join(WATCH_KEYS))
        if not isinstance(val, list):
            raise bad_input("bad_config", f"must be a list of names, not {type(val).__name__}",
                            file=str(path), key=where)
        for i, item in enumerate(val):
            if not isinstance(item, str) or not item.strip():
                raise bad_input("bad_config", f"must be a non-empty string, not {item!r}",
                                file=str(path), key=f"{where}[{i}]")
        values[key] = [v.strip() for v in val]
    return WatchConfig(**values, source=str(path))


# ============================================================================ static source


@dataclass
class _Found:
    module: str
    rel: str
    node: ast.AST


class _Source:
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

    def resolve(self, module: str, name: str, depth: int = 0) -> _Found | None:
        """Find the class, function or assignment that ``name`` means in ``module``."""
        if depth > 12:
            return None
        got = self.parse_module(module)
        if got is None:
            return None
        rel, mod = got
        is_pkg = rel.endswith("/__init__.py")
        found: _Found | None = None
        for stmt in _top_level(mod.body):
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                return _Found(module, rel, stmt)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                found = found or _Found(module, rel, stmt)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                if stmt.value is not None:
                    found = found or _Found(module, rel, stmt)
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

    def class_member(self, found: _Found, attr: str, depth: int = 0) -> _Found | None:
        """``attr`` in a class body, or in its statically resolvable bases."""
        cls = found.node
        if not isinstance(cls, ast.ClassDef) or depth > 8:
            return None
        for stmt in _top_level(cls.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == attr:
                return _Found(found.module, found.rel, stmt)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
                return _Found(found.module, found.rel, stmt)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
                return _Found(found.module, found.rel, stmt)
        for base in cls.bases:
            b = self.resolve_expr_class(found.module, base)
            if b is not None:
                hit = self.class_member(b, attr, depth + 1)
                if hit is not None:
                    return hit
        return None

    def resolve_expr_class(self, module: str, expr: ast.AST) -> _Found | None:
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
class _EnvVar:
    name: str
    expr: str
    default: str | None
    annotated: str | None


_GETENV_FUNCS = {"getenv", "get"}  # os.getenv(...), os.environ.get(...)


def _env_registry(src: _Source) -> tuple[dict[str, _EnvVar] | None, list[str]]:
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
    out: dict[str, _EnvVar] = {}
    for name, node in entries.items():
        default = _env_default(name, node)
        if default is None and isinstance(node, ast.Name) and node.id in functions:
            # ``"VLLM_PORT": get_vllm_port``: read the getter's body instead.
            default = _env_default(name, functions[node.id])
        out[name] = _EnvVar(name, ast.unparse(node), default, annotated.get(name))
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


def _compare_env(pin: _Source, cand: _Source, watch: WatchConfig) -> EnvDrift:
    old, old_notes = _env_registry(pin)
    new, new_notes = _env_registry(cand)
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


@dataclass
class _Arg:
    name: str
    type: str | None
    expr: str | None  # None: no default (a required field)
    value: str | None
    resolved: bool


_FIELD_FUNCS = {"field", "Field"}
_NO_DEFAULT = "<required>"


class _Resolver:
    """Resolve an EngineArgs default to the config-class default it refers to."""

    def __init__(self, src: _Source):
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


def _engine_args(src: _Source) -> tuple[dict[str, _Arg] | None, list[str]]:
    mod = src.parse(ARG_UTILS_FILE)
    if mod is None:
        return None, [src.errors.get(ARG_UTILS_FILE) or f"{ARG_UTILS_FILE} not found"]
    cls = next((s for s in mod.body if isinstance(s, ast.ClassDef) and s.name == ENGINE_ARGS_CLASS), None)
    if cls is None:
        return None, [f"{ARG_UTILS_FILE}: class {ENGINE_ARGS_CLASS} not found"]
    module = "vllm.engine.arg_utils"
    resolver = _Resolver(src)
    out: dict[str, _Arg] = {}
    unresolved: list[str] = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = ast.unparse(stmt.annotation)
        if ann.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value, ok = resolver.value(module, stmt.value)
        name = stmt.target.id
        out[name] = _Arg(name, ann, _unparse(stmt.value), value, ok)
        if not ok:
            unresolved.append(name)
    notes: list[str] = []
    if unresolved:
        notes.append(f"{len(unresolved)} default(s) kept as expressions (not statically resolvable): "
                     + ", ".join(unresolved[:8]) + (" ..." if len(unresolved) > 8 else ""))
    notes.extend(src.errors.values())
    return out, notes


def _config_layout(src: _Source) -> str | None:
    if src.module_file("vllm.config") == "vllm/config.py":
        return "module vllm/config.py"
    if src.module_file("vllm.config") == "vllm/config/__init__.py":
        return "package vllm/config/"
    return None


def _compare_engine_args(pin: _Source, cand: _Source, watch: WatchConfig) -> EngineArgDrift:
    old, old_notes = _engine_args(pin)
    new, new_notes = _engine_args(cand)
    notes = [f"pin: {n}" for n in old_notes] + [f"candidate: {n}" for n in new_notes]
    if old is None or new is None:
        return EngineArgDrift(available=False, notes=notes + ["engine arguments not compared"])
    lo, ln = _config_layout(pin), _config_layout(cand)
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


@dataclass
class _Req:
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


def _parse_requirement(line: str, group: str | None, notes: list[str], where: str) -> _Req | None:
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        notes.append(f"{where}: cannot parse {line!r} ({exc})")
        return None
    extra, marker = _split_extra(str(req.marker) if req.marker else None)
    return _Req(canonicalize_name(req.name), extra if extra is not None else group, marker,
                ",".join(sorted(str(s) for s in req.specifier)), sorted(req.extras))


def _dependencies(tree: TreeLike) -> tuple[list[_Req] | None, str, list[str]]:
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
    old, src_old, n_old = _dependencies(pin)
    new, src_new, n_new = _dependencies(cand)
    notes = [f"pin: {n}" for n in n_old] + [f"candidate: {n}" for n in n_new]
    drift = DependencyDrift(source_pin=src_old, source_candidate=src_new, notes=notes)
    if old is None or new is None:
        drift.available = False
        drift.notes.append("dependencies not compared")
        return drift
    if src_old != src_new:
        drift.notes.append(f"the pin's dependencies come from {src_old} and the candidate's from {src_new}; "
                           "groups may not line up")

    def index(reqs: list[_Req]) -> dict[tuple, _Req]:
        out: dict[tuple, _Req] = {}
        for r in reqs:
            key = (r.name, r.group, r.marker)
            if key in out:  # the same line twice: merge the specifiers
                prev = out[key]
                spec = ",".join(sorted(set(filter(None, (prev.spec + "," + r.spec).split(",")))))
                out[key] = _Req(r.name, r.group, r.marker, spec, sorted(set(prev.extras) | set(r.extras)))
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
    by_ng_add: dict[tuple, list[_Req]] = {}
    for r in added:
        by_ng_add.setdefault((r.name, r.group), []).append(r)
    by_ng_rem: dict[tuple, list[_Req]] = {}
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


def _dep_change(x: _Req, y: _Req, watch: WatchConfig) -> DependencyChange:
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


# ============================================================================ runtime targets


@dataclass
class _Target:
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


def _describe(found: _Found, in_class: bool) -> _Target:
    node = found.node
    loc = f"{found.rel}:{getattr(node, 'lineno', '?')}"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        decos = {_call_name(d) for d in node.decorator_list}
        kind = "property" if "property" in decos or "cached_property" in decos else (
            "method" if in_class else "function")
        sig, params = _signature(node)
        return _Target(kind, sig, params, loc)
    if isinstance(node, ast.ClassDef):
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if init is not None:
            sig, params = _signature(init)
            return _Target("class", sig, params, loc)
        return _Target("class", None, None, loc)
    return _Target("attribute", None, None, loc)


#: What :func:`_find_target` can say; the target is not None exactly when it says "ok".
_FindStatus = Literal["ok", "missing", "module_missing", "unparsable"]


def _find_target(src: _Source, target: str) -> tuple[_FindStatus, _Target | None]:
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


def runtime_target_drift(patches: Iterable[Any], pin: TreeLike, candidate: TreeLike) -> list[RuntimeTargetChange]:
    """For every runtime edit: does its target exist on the candidate, and did its signature change?"""
    return _runtime_targets(patches, _Source(pin), _Source(candidate))


def _runtime_targets(patches: Iterable[Any], ps: _Source, cs: _Source,
                     candidate_read: Any = None) -> list[RuntimeTargetChange]:
    out: list[RuntimeTargetChange] = []
    for patch in patches:
        for edit in getattr(patch, "runtime", None) or []:
            out.append(_check_target(patch.id, edit, ps, cs, candidate_read))
    return out


def _check_target(patch_id: str, edit: Any, ps: _Source, cs: _Source,
                  candidate_read: Any = None) -> RuntimeTargetChange:
    target: str = edit.target
    # Keyword arguments of RuntimeTargetChange, which validates them.
    base: dict[str, Any] = dict(patch=patch_id, edit=edit.name, target=target, required=getattr(edit, "required", True),
                declared_signature=getattr(edit, "signature", None))
    module = target.partition(":")[0]
    if module.split(".")[0] != "vllm":
        return RuntimeTargetChange(**base, status="unchecked", note="target is outside vllm; not in the trees")
    pst, pt = _find_target(ps, target)
    cst, ct = _find_target(cs, target)
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
    ps, cs = _Source(pin), _Source(candidate)
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


# ============================================================================ rendering

_MAX_CELL = 140


def _short(text: str | None, limit: int = _MAX_CELL) -> str:
    if text is None:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _md_code(text: str | None) -> str:
    if text is None:
        return "-"
    t = _short(text).replace("|", "\\|").replace("`", "'")
    return f"`{t}`" if t else "`''`"


def _dep_label(c: DependencyChange) -> str:
    label = c.name
    if c.group:
        label += f" [{c.group}]"
    return label


def _dep_spec(spec: str | None, extras: list[str], marker: str | None) -> str | None:
    if spec is None:
        return None
    text = (f"[{','.join(extras)}]" if extras else "") + (spec or "(any)")
    if marker:
        text += f"; {marker}"
    return text


def _env_old_new(c: EnvChange) -> tuple[str | None, str | None]:
    if c.change == "changed" and not c.default_changed:
        if c.old_expr == c.new_expr:
            return c.old_annotated, c.new_annotated
        return c.old_expr, c.new_expr
    old = c.old_default if c.old_default is not None else c.old_annotated
    new = c.new_default if c.new_default is not None else c.new_annotated
    if c.change == "added":
        return None, new if new is not None else c.new_expr
    if c.change == "removed":
        return old if old is not None else c.old_expr, None
    if c.old_default == c.new_default:  # only the TYPE_CHECKING default moved
        return c.old_annotated, c.new_annotated
    return old, new


def _rows(drift: ConfigDrift):
    """(section, rows) with rows of (attention, change, name, old, new, note), shared by both renderers."""
    deps = [(c.attention, c.change, _dep_label(c), _dep_spec(c.old, c.old_extras, c.old_marker),
             _dep_spec(c.new, c.new_extras, c.new_marker), c.detail)
            for c in _ordered(drift.dependencies)]
    env = []
    for c in _ordered(drift.env):
        old, new = _env_old_new(c)
        note = ""
        if c.change == "changed":
            note = ("default" if c.default_changed else
                    "expression only" if c.old_expr != c.new_expr else "TYPE_CHECKING default only")
        env.append((c.attention, c.change, c.name, old, new, note))
    args = []
    for c in _ordered(drift.engine_args):
        note = ""
        if c.change == "changed" and c.new_expr != c.old_expr and c.new_expr is not None:
            note = f"was {_short(c.old_expr, 60)}" if c.old_expr != c.old else ""
        if not c.resolved:
            note = (note + "; " if note else "") + "unresolved expression"
        args.append((c.attention, c.change, c.name, c.old, c.new, note))
    return [("Dependencies", drift.dependencies, deps), ("Environment defaults", drift.env, env),
            ("Engine arguments", drift.engine_args, args)]


def _ordered(section):
    items = [*section.changed, *section.added, *section.removed]
    # watched first; then the stable per-list order (changed, added, removed)
    return sorted(items, key=lambda c: not c.attention)


def render_markdown(drift: ConfigDrift) -> str:
    out = [f"## Configuration drift: {drift.pin or 'pin'} -> {drift.candidate or 'candidate'}", ""]
    if drift.watch_source:
        out.append(f"Watch list: `{drift.watch_source}`. "
                   f"**{drift.attention_count} watched item(s) changed.**" if drift.has_attention
                   else f"Watch list: `{drift.watch_source}`. No watched item changed.")
        out.append("")
    for title, section, rows in _rows(drift):
        counts = f"{len(section.changed)} changed, {len(section.added)} added, {len(section.removed)} removed"
        out.append(f"### {title} ({counts if section.available else 'not available'})")
        out.append("")
        for note in section.notes:
            out.append(f"> {note}")
        if section.notes:
            out.append("")
        if rows:
            out.append("| | change | name | old | new | note |")
            out.append("|---|---|---|---|---|---|")
            for att, change, name, old, new, note in rows:
                flag = "**!**" if att else ""
                out.append(f"| {flag} | {change} | `{name}` | {_md_code(old)} | {_md_code(new)} | "
                           f"{_short(note).replace('|', chr(92) + '|')} |")
            out.append("")
        elif section.available:
            out.append("No changes.")
            out.append("")
    if drift.runtime_targets:
        out.append("### Runtime-patch targets")
        out.append("")
        out.append("| patch | edit | target | status | pin | candidate | note |")
        out.append("|---|---|---|---|---|---|---|")
        for r in sorted(drift.runtime_targets, key=lambda r: (not r.broken, r.patch, r.edit)):
            status = f"**{r.status}**" if r.broken else r.status
            out.append(f"| {r.patch} | {r.edit} | `{r.target}` | {status} | {_md_code(r.pin_signature)} | "
                       f"{_md_code(r.candidate_signature)} | {_short(r.note).replace('|', chr(92) + '|')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_terminal(drift: ConfigDrift, console=None) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..render import make_console

    console = console or make_console()
    head = f"Configuration drift {drift.pin or 'pin'} -> {drift.candidate or 'candidate'}"
    if drift.watch_source:
        head += f"  (watch: {drift.watch_source}; {drift.attention_count} watched changed)"
    console.rule(head)
    for title, section, rows in _rows(drift):
        if not section.available:
            console.print(f"[bold]{title}[/bold]: not available")
            for note in section.notes:
                console.print(f"  [dim]{note}[/dim]", markup=True, highlight=False)
            continue
        table = Table(title=f"{title}: {len(section.changed)} changed, {len(section.added)} added, "
                            f"{len(section.removed)} removed", title_justify="left", show_lines=False)
        for col in ("!", "change", "name", "old", "new", "note"):
            table.add_column(col, overflow="fold")
        for att, change, name, old, new, note in rows:
            style = "bold yellow" if att else ("red" if change == "removed" else None)
            table.add_row("!" if att else "", change, Text(name), Text(_short(old)), Text(_short(new)),
                          Text(note), style=style)
        if rows:
            console.print(table)
        else:
            console.print(f"[bold]{title}[/bold]: no changes")
        for note in section.notes:
            console.print(Text(f"  {note}", style="dim"))
    if drift.runtime_targets:
        table = Table(title="Runtime-patch targets", title_justify="left")
        for col in ("patch", "edit", "target", "status", "note"):
            table.add_column(col, overflow="fold")
        for r in sorted(drift.runtime_targets, key=lambda r: (not r.broken, r.patch, r.edit)):
            table.add_row(r.patch, r.edit, Text(r.target), r.status, Text(r.note),
                          style="bold red" if r.broken else None)
        console.print(table)
