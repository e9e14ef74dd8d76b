"""Round-trip editing of sndr's YAML files: change one value, keep every other byte.

The watchlist (``patches/watchlist.yaml``) and the sync decisions
(``patches/sync-decisions.yaml``) are reviewed files: a tool that rewrote them
would refold long quoted notes and drop comments. Every edit here splices new
text into the original at the positions ruamel.yaml reports:

- :func:`splice_field` sets one key of one mapping row (inserting it in schema
  order when absent);
- :func:`append_row` adds a row at the end of a top-level list;
- :func:`remove_row` deletes one row of a top-level list.

Callers re-parse the result and compare it with the data they expected
(:func:`checked`), so an edit either changes exactly what was asked or writes
nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable
from typing import Any

from ..errors import EXIT_INTERNAL, Problem, SndrError

__all__ = ["append_row", "checked", "content_end", "key_node", "load_rt", "load_rt_nodes", "remove_row", "render_scalar",
           "row_node", "rt_yaml", "splice_field", "to_plain", "yaml_problem"]


def to_plain(obj: Any) -> Any:
    """ruamel round-trip objects -> plain dict/list/str/int/float/bool/date."""
    if isinstance(obj, dict):
        return {to_plain(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, _dt.datetime):
        return _dt.datetime.fromisoformat(obj.isoformat())
    if isinstance(obj, _dt.date):
        return _dt.date(obj.year, obj.month, obj.day)
    return obj


def rt_yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    return y


def yaml_problem(exc: Exception, file: str) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        mark = _constructing_mark(exc)
    line = mark.line + 1 if mark is not None else None
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return Problem("yaml_syntax", f"malformed YAML: {what}", file=file, line=line)


def _constructing_mark(exc: Exception):
    """The start mark of the node ruamel was constructing when ``exc`` (no mark of its own) was raised: a
    value that parses as YAML but not as its type, e.g. ``since: 2026-13-45`` ("month must be in 1..12",
    from the timestamp constructor), still gets its line. The innermost frame holding a ``node`` wins."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        mark = getattr(tb.tb_frame.f_locals.get("node"), "start_mark", None)
        if mark is not None:
            found = mark
        tb = tb.tb_next
    return found


def content_end(node, text: str) -> int:
    """Index just past the last character that belongs to a node's value.

    ruamel's end marks of block scalars and block sequences run on to the
    start of the next key; we only want the value itself.
    """
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

    start = node.start_mark.index
    if isinstance(node, ScalarNode) or not node.value or getattr(node, "flow_style", False):
        end = node.end_mark.index
    elif isinstance(node, SequenceNode):
        end = max(content_end(child, text) for child in node.value)
    elif isinstance(node, MappingNode):
        end = max(content_end(v, text) for _, v in node.value)
    else:  # pragma: no cover
        end = node.end_mark.index
    while end > start and text[end - 1] in " \t\r\n":
        end -= 1
    return end


def plain_ok(value: str) -> bool:
    if not value or value != value.strip() or "\n" in value or value.startswith(("'", '"')):
        return False
    from ruamel.yaml import YAML

    try:
        return YAML(typ="safe", pure=True).load(f"k: {value}\n") == {"k": value}
    except Exception:
        return False


def render_scalar(value: Any, indent: int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, _dt.date):
        return value.isoformat()
    if value is None:
        return "null"
    s = str(value)
    if plain_ok(s):
        return s
    if "\n" not in s:
        return "'" + s.replace("'", "''") + "'"
    body = s[:-1] if s.endswith("\n") else s
    lines = body.split("\n")
    if (not s.endswith("\n\n") and lines[0][:1] not in (" ", "\t") and all("\t" not in ln[:1] for ln in lines)
            and all(ln == ln.rstrip(" ") or ln.strip() for ln in lines)):
        head = "|" if s.endswith("\n") else "|-"
        pad = " " * (indent + 2)
        return head + "".join("\n" + (pad + ln if ln else "") for ln in lines)
    return json.dumps(s, ensure_ascii=False)


def key_node(mapping_node, key: str):
    for k, v in mapping_node.value:
        if getattr(k, "value", None) == key:
            return k, v
    return None


def row_node(root, section: str, index: int):
    pair = key_node(root, section)
    if pair is None:
        raise SndrError(Problem("internal", f"section {section!r} not found while editing"), EXIT_INTERNAL)
    return pair[1].value[index]


def splice_field(text: str, row_node, key: str, value: Any, field_order: list[str]) -> str:
    """Return ``text`` with ``key`` of the row at ``row_node`` set to ``value``."""
    from ruamel.yaml.nodes import SequenceNode

    pair = key_node(row_node, key)
    key_col = row_node.value[0][0].start_mark.column
    if pair is not None:
        knode, vnode = pair
        start, end = vnode.start_mark.index, content_end(vnode, text)
        if isinstance(value, list):
            block = isinstance(vnode, SequenceNode) and not vnode.flow_style and vnode.value
            if block and value:
                seq_col = vnode.start_mark.column
                rendered = ("\n" + " " * seq_col).join(f"- {render_scalar(v, seq_col + 2)}" for v in value)
            else:
                items = ", ".join(render_scalar(v, key_col) for v in value)
                rendered = f"[{items}]"
                if vnode.start_mark.line != knode.start_mark.line:
                    # the old block value sat on the next lines; an inline value goes after the colon
                    start = knode.end_mark.index
                    colon = text.index(":", start)
                    start, rendered = colon + 1, " " + rendered
        else:
            rendered = render_scalar(value, key_col)
            style = getattr(vnode, "style", None)
            if isinstance(value, str) and "\n" not in value and style in ("'", '"') and rendered[:1] not in ("'", '"'):
                # keep the quoting the author chose
                rendered = "'" + value.replace("'", "''") + "'" if style == "'" else json.dumps(value, ensure_ascii=False)
            if vnode.start_mark.line != knode.start_mark.line:
                colon = text.index(":", knode.end_mark.index)
                start, rendered = colon + 1, " " + rendered
        if "\n" not in rendered and "\n" not in text[start:end]:
            # keep an end-of-line comment in its column when there is room
            m = re.match(r"( +)#", text[end:])
            if m:
                pad = max(1, len(m.group(1)) - (len(rendered) - (end - start)))
                return text[:start] + rendered + " " * pad + text[end + len(m.group(1)):]
        return text[:start] + rendered + text[end:]
    # A new key goes on its own line after the nearest preceding key in schema order.
    present = [k.value for k, _ in row_node.value]
    pos = field_order.index(key) if key in field_order else len(field_order)
    before = [k for k in present if k in field_order and field_order.index(k) < pos] or present
    anchor_key = before[-1]
    _, anchor_val = key_node(row_node, anchor_key)
    end = content_end(anchor_val, text)
    nl = text.find("\n", end)
    insert_at = len(text) if nl < 0 else nl + 1
    pad = " " * key_col
    if isinstance(value, list) and value:
        rendered = "".join(f"\n{pad}- {render_scalar(v, key_col + 2)}" for v in value)
    elif isinstance(value, list):
        rendered = " []"
    else:
        rendered = " " + render_scalar(value, key_col)
    line = f"{pad}{key}:{rendered}\n"
    if nl < 0:
        line = "\n" + line
    return text[:insert_at] + line + text[insert_at:]


def load_rt(text: str, file: str) -> Any:
    """The round-trip data of ``text`` (line and column info kept); malformed YAML -> ``yaml_syntax``."""
    return load_rt_nodes(text, file)[0]


def _has_merge_key(root) -> bool:
    """True when a mapping of the node tree has a merge key (``<<``): ruamel's constructor deletes those
    pairs from the mapping nodes while it builds the data."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for k, v in node.value:
                if k.tag == "tag:yaml.org,2002:merge":
                    return True
                todo += (k, v)
        elif isinstance(node, SequenceNode):
            todo += node.value
    return False


def load_rt_nodes(text: str, file: str) -> tuple[Any, Any]:
    """``(data, root)``: the round-trip data of ``text`` (as :func:`load_rt`) and the node tree it was built
    from, the positions :func:`splice_field` edits at, from one parse. ``root`` is None when the tree is not
    the one a fresh ``compose`` gives (a merge key, which construction rewrites); compose ``text`` then."""
    from ruamel.yaml.error import YAMLError

    y = rt_yaml()
    composer = y.composer
    compose_one = composer.get_single_node
    kept: list[Any] = []

    def keep() -> Any:  # the node tree ruamel's load() builds its data from, before construction reads it
        node = compose_one()
        if node is not None and not _has_merge_key(node):
            kept.append(node)
        return node

    composer.get_single_node = keep
    try:
        data = y.load(text)
    except YAMLError as exc:
        raise SndrError(yaml_problem(exc, file)) from None
    except Exception as exc:  # ruamel raises a few non-YAMLError types (e.g. DuplicateKeyError)
        raise SndrError(yaml_problem(exc, file)) from None
    return data, (kept[0] if kept else None)


def _section(text: str, section: str):
    root = rt_yaml().compose(text)
    pair = key_node(root, section)
    if pair is None:
        raise SndrError(Problem("internal", f"section {section!r} not found while editing"), EXIT_INTERNAL)
    return root, pair


def _render_row(row: dict, field_order: list[str], col: int) -> str:
    keys = [k for k in field_order if k in row] + [k for k in row if k not in field_order]
    pad = " " * col
    out = []
    for n, k in enumerate(keys):
        v = row[k]
        lead = f"{pad}- " if n == 0 else f"{pad}  "
        if isinstance(v, list) and v:
            items = "".join(f"\n{pad}  - {render_scalar(x, col + 4)}" for x in v)
            out.append(f"{lead}{k}:{items}")
        elif isinstance(v, list):
            out.append(f"{lead}{k}: []")
        else:
            out.append(f"{lead}{k}: {render_scalar(v, col + 2)}")
    return "\n".join(out) + "\n"


def append_row(text: str, section: str, row: dict, field_order: list[str]) -> str:
    """``text`` with ``row`` appended to the top-level list ``section`` (which must exist)."""
    _root, (knode, vnode) = _section(text, section)
    items = getattr(vnode, "value", None) or []
    if items and not getattr(vnode, "flow_style", False):
        col = vnode.start_mark.column
        end = content_end(vnode, text)
        nl = text.find("\n", end)
        at = len(text) if nl < 0 else nl + 1
        block = _render_row(row, field_order, col)
        if nl < 0:
            block = "\n" + block
        return text[:at] + block + text[at:]
    if items:
        raise SndrError(Problem("internal", f"section {section!r} is a flow list; write it as a block list "
                                "to edit it"), EXIT_INTERNAL)
    # an empty section: ``key: []`` or ``key:`` -> a block list on the next lines
    colon = text.index(":", knode.end_mark.index)
    end = content_end(vnode, text) if getattr(vnode, "value", None) is not None and vnode.end_mark.index > colon else colon + 1
    nl = text.find("\n", end)
    rest = text[nl:] if nl >= 0 else "\n"
    return text[:colon + 1] + "\n" + _render_row(row, field_order, knode.start_mark.column).rstrip("\n") + rest


def remove_row(text: str, section: str, index: int) -> str:
    """``text`` without row ``index`` of the top-level list ``section`` (an emptied list becomes ``[]``)."""
    _root, (knode, vnode) = _section(text, section)
    items = vnode.value
    item = items[index]
    line_start = text.rfind("\n", 0, item.start_mark.index) + 1
    end = content_end(item, text)
    nl = text.find("\n", end)
    line_end = len(text) if nl < 0 else nl + 1
    if len(items) == 1:
        colon = text.index(":", knode.end_mark.index)
        return text[:colon + 1] + " []\n" + text[line_end:]
    return text[:line_start] + text[line_end:]


def checked(new_text: str, expected: Any, parse: Callable[[str], Any], label: str, file: str) -> str:
    """``new_text`` when ``parse(new_text)`` equals ``expected``; else an internal error, nothing written."""
    try:
        again = parse(new_text)
    except SndrError as exc:
        raise SndrError(Problem("internal", f"editing {label} produced an invalid file: {exc.render()}",
                                file=file), EXIT_INTERNAL) from None
    if again != expected:
        raise SndrError(Problem("internal", f"editing {label} would change more than that; file left untouched",
                                file=file), EXIT_INTERNAL)
    return new_text
