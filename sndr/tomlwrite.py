"""Write a :class:`~sndr.model.Patch` as a readable patch file (docs/format.md).

Code (anchors, replacements, created files) goes into TOML multi-line literal
strings (``'''``) so it reads exactly as it sits in the source file. TOML
cannot hold every text that way: a literal string cannot contain ``'''``, a
carriage return or other control characters. Such values fall back to
multi-line basic strings (``\"\"\"``) with escapes. Either way the output is
parsed back and compared with the model before it is returned, so a writer
bug can never produce a patch that means something else than the model.
"""

from __future__ import annotations

import enum
import re
import tomllib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from .model import Edit, FileEdits, Patch, RuntimeEdit

__all__ = ["dumps_patch", "toml_string", "toml_multiline"]

# Key order per table; fields not named here follow in declaration order.
_ORDER: dict[type, list[str]] = {
    Patch: ["id", "title", "kind", "lifecycle", "default", "vllm", "upstream", "requires", "conflicts",
            "merged_markers", "module", "groups", "description"],
    FileEdits: ["path", "merged_markers", "create"],
    Edit: ["name", "required", "group", "merged_markers", "description", "anchor", "replacement"],
    RuntimeEdit: ["name", "target", "replacement", "required", "signature", "source_sha256", "chain", "wrap",
                  "description"],
}
# Keys written even when they hold their default: the ones a reader of a patch
# file expects to see (docs/format.md, "A patch", shows them).
_ALWAYS: dict[type, set[str]] = {
    Patch: {"id", "title", "kind", "lifecycle", "default", "upstream"},
    FileEdits: {"path"},
    Edit: {"name", "anchor", "replacement", "merged_markers"},
    RuntimeEdit: {"name", "target", "replacement"},
}
# Values that are code: always written as multi-line strings.
_CODE = {(Edit, "anchor"), (Edit, "replacement"), (FileEdits, "create")}
# Nested arrays of tables, written after the table's own keys.
_TABLES = {Patch: ["files", "runtime"], FileEdits: ["edits"]}

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# Characters a literal string may not hold (TOML 1.0: control characters other
# than tab; CR is refused too, because parsers may normalise CRLF).
_NOT_LITERAL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_NOT_LITERAL_ML = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def _escape(s: str, *, keep: str = "") -> str:
    out = []
    for ch in s:
        if ch in keep:
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


def toml_string(s: str) -> str:
    """A one-line TOML string: literal ('...') when that needs no escapes and reads better, else basic."""
    if ('"' in s or "\\" in s) and "'" not in s and not _NOT_LITERAL.search(s):
        return f"'{s}'"
    return f'"{_escape(s)}"'


def toml_multiline(s: str) -> str:
    """A multi-line TOML string holding ``s`` exactly, starting on the line after the opening quotes."""
    if "'''" not in s and not s.endswith("'") and not _NOT_LITERAL_ML.search(s):
        return "'''\n" + s + "'''"
    # Basic multi-line: escape everything but newlines and tabs. Escaping every
    # quote keeps '\"\"\"' out of the body without any look-ahead.
    return '"""\n' + _escape(s, keep="\n\t") + '"""'


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else toml_string(k)


def _value(v: Any, *, code: bool = False) -> str:
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        if code or "\n" in v and len(v) > 60:
            return toml_multiline(v)
        return toml_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _fields(model: BaseModel) -> list[str]:
    cls = type(model)
    names = list(cls.model_fields)
    first = [n for n in _ORDER.get(cls, []) if n in names]
    return first + [n for n in names if n not in first]


def _keys(model: BaseModel) -> list[str]:
    cls = type(model)
    tables = _TABLES.get(cls, [])
    always = _ALWAYS.get(cls, set())
    lines = []
    for name in _fields(model):
        if name in tables:
            continue
        value = getattr(model, name)
        if value is None:
            continue
        field = cls.model_fields[name]
        default = field.get_default(call_default_factory=True)
        if name not in always and value == default:
            continue
        lines.append(f"{_key(name)} = {_value(value, code=(cls, name) in _CODE)}")
    return lines


def _comment(text: str | Iterable[str] | None) -> list[str]:
    if not text:
        return []
    lines = text.splitlines() if isinstance(text, str) else [ln for t in text for ln in str(t).splitlines()]
    return [("# " + ln).rstrip() for ln in lines]


def dumps_patch(patch: Patch, *, header: str | Iterable[str] | None = None,
                comments: dict[str, str] | None = None) -> str:
    """The patch file text of ``patch``.

    ``header`` becomes a comment block at the top (why the patch exists);
    ``comments`` maps an edit name (or a file path) to a comment written
    above its table. Raises ``ValueError`` if the text would not parse back
    to exactly ``patch``.
    """
    comments = comments or {}
    out: list[str] = _comment(header)
    out += _keys(patch)
    for name in _TABLES[Patch]:
        for item in getattr(patch, name):
            out.append("")
            if isinstance(item, FileEdits):
                out += _comment(comments.get(item.path))
                out.append("[[files]]")
                out += _keys(item)
                for edit in item.edits:
                    out.append("")
                    out += _comment(comments.get(edit.name))
                    out.append("[[files.edits]]")
                    out += _keys(edit)
            else:
                out += _comment(comments.get(item.name))
                out.append(f"[[{name}]]")
                out += _keys(item)
    text = "\n".join(out) + "\n"
    _check_roundtrip(text, patch)
    return text


def _check_roundtrip(text: str, patch: Patch) -> None:
    try:
        back = Patch.model_validate(tomllib.loads(text))
    except Exception as exc:  # noqa: BLE001 - any failure here is a writer bug
        raise ValueError(f"internal: written TOML for {patch.id} does not load back: {exc}") from exc
    if back != patch:
        raise ValueError(f"internal: written TOML for {patch.id} loads back as a different patch")
