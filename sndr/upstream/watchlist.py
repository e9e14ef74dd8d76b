"""The upstream watchlist: schema, round-trip edits, lint and trigger evaluation.

The watchlist (``patches/watchlist.yaml`` by default) tracks the upstream PRs
that matter to the local patch set. It has two sections:

- ``watch``: one row per upstream PR or issue, with its status, the local
  patches it concerns and what to do about it (``action``);
- ``sweep``: one row per PR found by an upstream sweep, with the patch it
  concerns (free text such as ``'PN340, PN341'`` or ``'planned: PN-tbd (...)'``)
  and the trigger that fires when it merges.

The file ends with ``__sentinel__: complete`` so that a truncated file is an
error rather than a shorter watchlist.

Loading is lossless: :meth:`Watchlist.to_data` gives back exactly the data that
was read. Editing (:func:`set_field`) splices the new value into the original
text at the positions ruamel.yaml reports, so comments and the formatting of
every other line survive byte for byte; a full re-dump would refold the long
quoted notes.

Lint lives in :mod:`.watchlist_lint` and trigger evaluation in :mod:`.triggers`;
import their names from there.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from ..errors import Problem, SndrError, bad_input
from .yamledit import (  # noqa: F401 - to_plain and the editor helpers are public here too
    checked,
    content_end,
    load_rt,
    load_rt_nodes,
    render_scalar,
    row_node,
    rt_yaml,
    splice_field,
    to_plain,
    yaml_problem,
)

# ----------------------------------------------------------------------------- vocabulary

Status = Literal["open", "closed", "merged"]
STATUSES: tuple[Status, ...] = get_args(Status)
Action = Literal["watch", "drift-check", "a-b-test", "retire", "port", "cookbook"]
ACTIONS: tuple[Action, ...] = get_args(Action)
Trigger = Literal["retire-on-merge", "reanchor-on-merge", "review-on-merge"]
TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)
FixStatus = Literal["open", "closed", "merged", "merged-in-pin", "merged-NOT-in-pin", "open-NOT-in-pin"]
FIX_STATUSES: tuple[FixStatus, ...] = get_args(FixStatus)
Detection = Literal["preflight", "manual", "test"]
DETECTIONS: tuple[Detection, ...] = get_args(Detection)
Section = Literal["watch", "sweep"]
SEVERITY_PRIORITIES = ("P0", "P1", "P2", "P3")
SEVERITY_CLASSES = ("correctness", "crash", "perf", "cleanup")

#: What a watch row's ``action`` means as a trigger when the watchlist is
#: checked against a preflight: retire and drift-check rows wait for the
#: patch to come out merged or drifted; every other action is a review.
ACTION_TRIGGER: dict[Action, Trigger] = {
    "retire": "retire-on-merge",
    "drift-check": "reanchor-on-merge",
    "watch": "review-on-merge",
    "a-b-test": "review-on-merge",
    "port": "review-on-merge",
    "cookbook": "review-on-merge",
}

SENTINEL_KEY: Final = "__sentinel__"
SENTINEL_VALUE: Final = "complete"
WATCHLIST_NAME = "watchlist.yaml"

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
UPSTREAM_PATTERN = r"^(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]+#[1-9][0-9]*$"
_ISO_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"

PatchId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
UpstreamRef = Annotated[str, StringConstraints(pattern=UPSTREAM_PATTERN)]
# ``since: 2026-06-19`` is a YAML date; ``since: '2026-06-19'`` is a string. Both
# occur in the field; keeping the type is what makes load -> dump lossless.
Since = _dt.date | Annotated[str, StringConstraints(pattern=_ISO_DATE)]


def _nonblank(items: list[str], what: str) -> list[str]:
    for item in items:
        if not item.strip():
            raise ValueError(f"{what} must not contain empty strings")
    return items


_MARKERS_DOC = ("texts whose presence in a tree identifies this PR as merged (matched against a preflight's "
                "newly_merged markers)")


class _Row(BaseModel):
    # strict: a YAML ``pr: '46384'`` or ``status: yes`` is an error, not a coercion
    # that would change the data on the way back out.
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("markers", check_fields=False)
    @classmethod
    def _markers_ok(cls, v: list[str]) -> list[str]:
        return _nonblank(v, "markers")

    @property
    def key(self) -> str:
        """The row's identity in its section: ``vllm#N`` (watch) or ``#N`` (sweep)."""
        raise NotImplementedError


class WatchRow(_Row):
    """One tracked upstream PR or issue."""

    upstream: UpstreamRef = Field(description="vllm#NNNNN or owner/repo#N")
    status: Status
    severity: str | None = Field(default=None, description="P0..P3 '-' correctness|crash|perf|cleanup")
    local_patches: list[PatchId] = Field(default_factory=list)
    action: Action
    since: Since | None = None
    notes: str | None = None
    fix_upstream: UpstreamRef | None = None
    fix_status: FixStatus | None = None
    affects_models: list[str] = Field(default_factory=list)
    markers: list[str] = Field(default_factory=list, description=_MARKERS_DOC)

    @field_validator("severity")
    @classmethod
    def _severity_ok(cls, v: str | None) -> str | None:
        if v is None:
            return v
        prio, _, klass = v.partition("-")
        if prio not in SEVERITY_PRIORITIES or klass not in SEVERITY_CLASSES:
            raise ValueError(
                f"{v!r} is not a severity; use one of {', '.join(SEVERITY_PRIORITIES)} followed by "
                f"'-' and one of {', '.join(SEVERITY_CLASSES)} (e.g. P1-crash)"
            )
        return v

    @field_validator("affects_models")
    @classmethod
    def _models_ok(cls, v: list[str]) -> list[str]:
        return _nonblank(v, "affects_models")

    @property
    def key(self) -> str:
        return self.upstream

    @property
    def trigger(self) -> Trigger:
        return ACTION_TRIGGER[self.action]

    def patch_ids(self) -> list[str]:
        return list(self.local_patches)

    def pr_number(self) -> int | None:
        repo, _, num = self.upstream.rpartition("#")
        return int(num) if repo in ("vllm", "vllm-project/vllm") else None


@dataclass(frozen=True)
class PatchRef:
    """What a sweep row's free-text ``genesis_patch`` names.

    kind: ``ids`` (a comma-separated list of patch ids), ``planned`` (a patch
    that does not exist yet; ``ids`` holds its id when the text gives one),
    ``watch-only`` (no patch), or ``text`` (anything else).
    """

    kind: Literal["ids", "planned", "watch-only", "text"]
    ids: tuple[str, ...] = ()


def parse_patch_ref(text: str) -> PatchRef:
    s = text.strip()
    if s == "watch-only":
        return PatchRef("watch-only")
    if s.startswith("planned:"):
        rest = s[len("planned:"):].strip()
        return PatchRef("planned", (rest,) if re.match(ID_PATTERN, rest) else ())
    parts = [p.strip() for p in s.split(",")]
    if parts and all(re.match(ID_PATTERN, p) for p in parts):
        return PatchRef("ids", tuple(parts))
    return PatchRef("text")


class SweepRow(_Row):
    """One PR found by an upstream sweep."""

    pr: int = Field(gt=0)
    genesis_patch: str = Field(description="free text: 'PN340, PN341', 'watch-only', 'planned: PN-tbd (...)'")
    trigger: Trigger
    detection: Detection | None = Field(
        default=None, description="how drift is caught when the preflight cannot (absent: preflight)"
    )
    note: str | None = None
    markers: list[str] = Field(default_factory=list, description=_MARKERS_DOC)

    @field_validator("genesis_patch")
    @classmethod
    def _patch_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("genesis_patch is empty; write 'watch-only' when no patch is concerned")
        return v

    @property
    def key(self) -> str:
        return f"#{self.pr}"

    @property
    def patch_ref(self) -> PatchRef:
        return parse_patch_ref(self.genesis_patch)

    def patch_ids(self) -> list[str]:
        ref = self.patch_ref
        return list(ref.ids) if ref.kind == "ids" else []


class Watchlist(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    watch: list[WatchRow] = Field(default_factory=list)
    sweep: list[SweepRow] = Field(default_factory=list)
    sentinel: Literal["complete"] = Field(  # SENTINEL_VALUE (a Literal takes no names)
        alias=SENTINEL_KEY, description="must be the last key: a file cut short loses it and fails to load"
    )

    def to_data(self) -> dict:
        """The plain data this watchlist was loaded from (keys that were absent stay absent)."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    def rows(self) -> Iterable[tuple[Section, int, WatchRow | SweepRow]]:
        for i, w in enumerate(self.watch):
            yield "watch", i, w
        for i, s in enumerate(self.sweep):
            yield "sweep", i, s


SECTIONS: dict[str, type[WatchRow] | type[SweepRow]] = {"watch": WatchRow, "sweep": SweepRow}


def json_schema() -> dict:
    return Watchlist.model_json_schema(by_alias=True)


# ----------------------------------------------------------------------------- loading


def default_watchlist_path() -> Path:
    """``<patch dir>/watchlist.yaml``; the patch dir is :func:`sndr.env.patches_dir`."""
    from ..env import patches_dir

    return patches_dir() / WATCHLIST_NAME


@dataclass
class LoadedWatchlist:
    """A validated watchlist plus what is needed to point at its lines."""

    model: Watchlist
    text: str
    file: str
    raw: Any  # ruamel CommentedMap (line/column info)
    #: The node tree ``raw`` was built from (the positions an edit splices at); None: compose ``text`` again.
    nodes: Any = None

    def line_of(self, section: str, index: int, key: str | None = None) -> int | None:
        try:
            row = self.raw[section][index]
            if key is not None and key in row:
                return row.lc.key(key)[0] + 1
            return row.lc.line + 1
        except (KeyError, IndexError, AttributeError, TypeError):
            return None

    def row_label(self, section: str, index: int) -> str:
        try:
            row = self.model.watch[index] if section == "watch" else self.model.sweep[index]
            return f"{section}[{index}] {row.key}"
        except IndexError:
            return f"{section}[{index}]"


def _raw_row_label(section: str, index: int, row: Any) -> str:
    key = "upstream" if section == "watch" else "pr"
    if isinstance(row, dict) and key in row:
        return f"{section}[{index}] {row[key] if section == 'watch' else '#' + str(row[key])}"
    return f"{section}[{index}]"


_PATTERN_NAMES = {
    ID_PATTERN: "a patch id (letters, digits, '_' and '-', starting with a letter)",
    UPSTREAM_PATTERN: "an upstream reference such as vllm#12345 or owner/repo#12",
    _ISO_DATE: "a date YYYY-MM-DD",
}


def _pydantic_problems(exc: ValidationError, file: str, label: str, raw_row: Any, row_line: int | None) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        # Unions report one error per member; the member name is noise to a reader.
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("date", "str"))))
        key = str(loc[0]) if loc else None
        line = row_line
        try:
            if key is not None and key in raw_row:
                line = raw_row.lc.key(key)[0] + 1
        except (AttributeError, TypeError, KeyError):
            pass
        etype = err.get("type", "")
        value = err.get("input")
        idx = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
        if idx is not None:
            try:
                line = raw_row[key].lc.item(idx)[0] + 1
            except (AttributeError, TypeError, KeyError, IndexError):
                pass
        pattern = err.get("ctx", {}).get("pattern")
        if etype == "string_pattern_mismatch" and pattern in _PATTERN_NAMES:
            where = f"{key}[{idx}]" if idx is not None else key
            msg = f"{where}: {value!r} is not {_PATTERN_NAMES[pattern]}"
        elif etype == "extra_forbidden":
            msg = f"unknown key {key!r}"
        elif etype == "missing":
            msg = f"missing required key {key!r}"
        elif etype == "literal_error":
            allowed = err.get("ctx", {}).get("expected", "")
            msg = f"{value!r} is not a known value; expected {allowed}"
        else:
            msg = err.get("msg", "invalid")
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            if len(loc) > 1:
                msg = f"{key}{''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in loc[1:])}: {msg}"
            if value is not None and not isinstance(value, (dict, list)) and repr(value) not in msg:
                msg = f"{msg} (got {value!r})"
        problems.append(Problem("bad_watchlist", f"{label}: {msg}", file=file, line=line, key=key))
    # One union error per member collapses to one problem per (line, key).
    seen, unique = set(), []
    for p in problems:
        if (p.line, p.key) not in seen or p.key is None:
            seen.add((p.line, p.key))
            unique.append(p)
    return unique


def parse_watchlist(text: str, file: str = "<watchlist>") -> LoadedWatchlist:
    """Parse and validate watchlist text; every problem names the row and the key."""
    from ruamel.yaml.comments import CommentedMap

    raw, nodes = load_rt_nodes(text, file)
    if not isinstance(raw, CommentedMap):  # the round-trip loader gives every mapping as a CommentedMap
        raise bad_input("bad_watchlist", "a watchlist is a mapping with 'watch', 'sweep' and '__sentinel__'",
                        file=file, line=1)
    problems: list[Problem] = []
    keys = list(raw.keys())
    for k in keys:
        if k not in ("watch", "sweep", SENTINEL_KEY):
            problems.append(Problem("bad_watchlist", f"unknown top-level key {k!r}", file=file,
                                    line=raw.lc.key(k)[0] + 1, key=str(k)))
    if SENTINEL_KEY not in raw:
        problems.append(Problem("truncated_watchlist",
                                f"no '{SENTINEL_KEY}: {SENTINEL_VALUE}' line: the file is truncated or incomplete",
                                file=file, key=SENTINEL_KEY,
                                hint=f"end the file with '{SENTINEL_KEY}: {SENTINEL_VALUE}'"))
    else:
        if raw[SENTINEL_KEY] != SENTINEL_VALUE:
            problems.append(Problem("bad_watchlist", f"'{SENTINEL_KEY}' must be {SENTINEL_VALUE!r}, got "
                                    f"{raw[SENTINEL_KEY]!r}", file=file, line=raw.lc.key(SENTINEL_KEY)[0] + 1,
                                    key=SENTINEL_KEY))
        if keys[-1] != SENTINEL_KEY:
            problems.append(Problem("bad_watchlist", f"'{SENTINEL_KEY}' must be the last key",
                                    file=file, line=raw.lc.key(SENTINEL_KEY)[0] + 1, key=SENTINEL_KEY))
    sections: dict[str, list] = {}
    for section, model in SECTIONS.items():
        rows = raw.get(section, [])
        if section in raw and not isinstance(rows, list):
            problems.append(Problem("bad_watchlist", f"'{section}' must be a list of rows", file=file,
                                    line=raw.lc.key(section)[0] + 1, key=section))
            continue
        out = []
        for i, row in enumerate(rows or []):
            label = _raw_row_label(section, i, row)
            line = None
            try:
                line = rows.lc.item(i)[0] + 1
            except (AttributeError, KeyError, TypeError):
                pass
            if not isinstance(row, dict):
                problems.append(Problem("bad_watchlist", f"{label}: a row must be a mapping", file=file, line=line))
                continue
            try:
                out.append(model.model_validate(to_plain(row)))
            except ValidationError as exc:
                problems.extend(_pydantic_problems(exc, file, label, row, line))
        sections[section] = out
    if problems:
        raise SndrError(problems)
    data = {k: sections[k] for k in ("watch", "sweep") if k in raw}
    wl = Watchlist.model_validate({**data, SENTINEL_KEY: SENTINEL_VALUE})
    return LoadedWatchlist(model=wl, text=text, file=file, raw=raw, nodes=nodes)


def read_text_file(path: Path, what: str = "file") -> str:
    """A file's text as strict UTF-8 (:func:`sndr.fsio.read_text_strict`); problems are bad input."""
    from ..fsio import FileProblem, read_text_strict

    try:
        return read_text_strict(path, what=what)
    except FileNotFoundError:
        raise bad_input("not_found", f"{what} does not exist", file=str(path)) from None
    except FileProblem as exc:
        raise bad_input(exc.code, exc.message, file=exc.path, line=exc.line) from None


def load_watchlist(path: Path | str | None = None) -> LoadedWatchlist:
    path = Path(path) if path is not None else default_watchlist_path()
    return parse_watchlist(read_text_file(path, "watchlist"), str(path))


# ----------------------------------------------------------------------------- selecting rows


def find_row(wl: Watchlist, selector: str, file: str | None = None) -> tuple[str, int]:
    """``vllm#40886`` / ``owner/repo#N`` -> a watch row; ``#46384``, ``46384`` or ``pr:46384`` -> a sweep row.

    ``watch:vllm#40886`` and ``sweep:46384`` name the section explicitly.
    """
    sel = selector.strip()
    section = None
    for prefix in ("watch:", "sweep:"):
        if sel.startswith(prefix):
            section, sel = prefix[:-1], sel[len(prefix):]
    if sel.startswith("pr:"):
        section, sel = "sweep", sel[3:]
    if section is None:
        section = "sweep" if re.fullmatch(r"#?[0-9]+", sel) else "watch"
    if section == "sweep":
        num = sel.lstrip("#")
        if not num.isdigit():
            raise bad_input("bad_selector", f"{selector!r}: a sweep row is selected by its PR number", file=file)
        hits = [i for i, r in enumerate(wl.sweep) if r.pr == int(num)]
    else:
        hits = [i for i, r in enumerate(wl.watch) if r.upstream == sel]
    if not hits:
        raise bad_input("no_such_row", f"no {section} row {sel!r}", file=file,
                        hint="select a watch row by 'vllm#N' and a sweep row by '#N'")
    if len(hits) > 1:
        raise bad_input("ambiguous_row", f"{len(hits)} {section} rows match {sel!r} (rows "
                        f"{', '.join(str(h) for h in hits)}); fix the duplicate first (see 'watchlist lint')", file=file)
    return section, hits[0]


# ----------------------------------------------------------------------------- round-trip editing

_LIST_FIELDS = {"local_patches", "affects_models", "markers"}


def parse_cli_value(section: str, key: str, raw: str) -> Any:
    """The typed value of ``watchlist set ... KEY VALUE`` (lists are comma-separated)."""
    model = SECTIONS[section]
    if key not in model.model_fields:
        raise bad_input("unknown_key", f"{section} rows have no key {key!r}; known: {', '.join(model.model_fields)}",
                        key=key)
    if key in _LIST_FIELDS:
        return [p.strip() for p in raw.split(",") if p.strip()]
    if key == "pr":
        if not raw.strip().isdigit():
            raise bad_input("bad_value", f"pr must be a number, got {raw!r}", key=key)
        return int(raw)
    if key == "since":
        try:
            return _dt.date.fromisoformat(raw.strip())
        except ValueError:
            raise bad_input("bad_value", f"since must be a date YYYY-MM-DD, got {raw!r}", key=key) from None
    return raw


def set_field(text: str, selector: str, key: str, value: Any, file: str = "<watchlist>") -> str:
    """Set ``key`` of the selected row to ``value`` (typed) and return the new text.

    Only the lines of that value change. The result is re-parsed and must equal
    the old data with exactly this one change, or nothing is returned.
    """
    return edit_field(parse_watchlist(text, file), selector, key, value)


def edit_field(loaded: LoadedWatchlist, selector: str, key: str, value: Any) -> str:
    """:func:`set_field` on an already parsed watchlist (its text and file name): the new text."""
    return edit_watchlist(loaded, selector, key, value).text


def edit_watchlist(loaded: LoadedWatchlist, selector: str, key: str, value: Any) -> LoadedWatchlist:
    """:func:`edit_field`, returning the new text parsed: the parse that checked it (one parse per edit, where
    a caller that needs the new document parsed it a second time)."""
    text, file = loaded.text, loaded.file
    section, index = find_row(loaded.model, selector, file)
    model = SECTIONS[section]
    if key not in model.model_fields:
        raise bad_input("unknown_key", f"{section} rows have no key {key!r}; known: {', '.join(model.model_fields)}",
                        file=file, key=key)
    expected = loaded.model.to_data()
    row = dict(expected[section][index])
    row[key] = value
    label = loaded.row_label(section, index)
    try:
        model.model_validate(row)
    except ValidationError as exc:
        raise SndrError(_pydantic_problems(exc, file, label, loaded.raw[section][index],
                                           loaded.line_of(section, index))) from None
    if expected[section][index].get(key, object()) == value and key in expected[section][index]:
        return loaded
    expected[section][index] = row
    root = loaded.nodes if loaded.nodes is not None else rt_yaml().compose(text)
    new_text = splice_field(text, row_node(root, section, index), key, value, list(model.model_fields))
    parsed: list[LoadedWatchlist] = []

    def parse(t: str) -> dict:
        parsed.append(parse_watchlist(t, file))
        return parsed[-1].model.to_data()

    checked(new_text, expected, parse, f"{label} [{key}]", file)
    return parsed[0]


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically through the one output writer (:func:`sndr.cli.write_output`:
    never through a symlink, FIFO or device, nor over another user's file)."""
    from ..cli import write_output

    write_output(path, text, "the watchlist")
