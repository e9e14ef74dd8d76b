"""The configuration-drift result models and the operator's watch list.

The pydantic models a bump preflight reports (:class:`ConfigDrift` and its
sections), :class:`WatchConfig` with the file it is read from
(:func:`load_watch_config`), and the :class:`TreeLike` protocol the readers in
:mod:`.configsource` take. The comparison is :mod:`.configdrift`; the rendering
:mod:`.configrender`.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import bad_input

CONFIG_FILE_NAMES = ("sndr.toml", "pyproject.toml")
#: Top-level tables of sndr.toml (``[tool.sndr]`` in a pyproject) that this
#: module understands. Another module that adds a table adds its name here.
KNOWN_SECTIONS = ("watch",)
WATCH_KEYS = ("env", "engine_args", "dependencies")


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
