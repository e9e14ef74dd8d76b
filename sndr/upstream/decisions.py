"""Kept decisions on the sync queue, and deviations: ``patches/sync-decisions.yaml``.

A queue is re-planned many times during a bump; the human judgement on it must
survive each re-plan. The decisions file keeps it, keyed by upstream commit
sha, in a reviewable YAML file edited round-trip (comments and formatting of
every other line survive; :mod:`sndr.upstream.yamledit`):

``decisions``
    one row per commit: ``sha`` (7 to 40 hex digits; a prefix names the one
    commit it starts), ``subject`` (for the reader), ``tier`` (``PORT-NOW``,
    ``INVENTORY`` or ``IGNORE``), ``resolution`` (``ported-as <patch id>``,
    ``not-needed <reason>`` or ``deferred``) and ``note``. A queued commit
    counts as decided when it has a resolution; ``pin advance`` refuses while
    a queued commit is undecided.
``deviations``
    one row per place where the local tree intentionally differs from
    upstream: ``patch`` (the patch id), ``upstream`` (the PR, ``vllm#N``),
    ``why``, ``discharge`` (the upstream commit, sha or ``vllm#N``, that will
    make the deviation unnecessary), ``paths`` (files it lives in; default:
    the patch's files) and ``reviewed`` (the target it was last reviewed
    for). ``sync plan`` flags in-range commits that touch a deviation;
    ``pin advance`` refuses while a touched deviation is not reviewed for the
    target (or removed, once discharged).

The file ends with ``__sentinel__: complete``, as the watchlist does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ..errors import Problem, SndrError, bad_input
from .defaults import DECISIONS_NAME  # its one home: stdlib only, read by the parser
from .yamledit import append_row, checked, load_rt, remove_row, row_node, rt_yaml, splice_field, to_plain

__all__ = ["DECISIONS_NAME", "Decision", "Decisions", "Deviation", "LoadedDecisions", "RESOLUTION_PATTERN",
           "TIERS", "default_decisions_path", "deviation_set", "drop_deviation", "load_decisions",
           "parse_decisions", "set_decision", "set_deviation"]


Tier = Literal["PORT-NOW", "INVENTORY", "IGNORE"]
TIERS: tuple[Tier, ...] = get_args(Tier)
RESOLUTION_PATTERN = r"^(?:ported-as [A-Za-z][A-Za-z0-9_-]*|not-needed \S.*|deferred)$"
SHA_PATTERN = r"^[0-9a-f]{7,40}$"
_REF = r"^(?:[0-9a-f]{7,40}|(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]+#[1-9][0-9]*)$"
SENTINEL_KEY: Final = "__sentinel__"
SENTINEL_VALUE: Final = "complete"

Sha = Annotated[str, StringConstraints(pattern=SHA_PATTERN)]


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sha: Sha = Field(description="upstream commit (7 to 40 hex digits)")
    subject: str | None = None
    tier: Tier | None = None
    resolution: Annotated[str, StringConstraints(pattern=RESOLUTION_PATTERN)] | None = Field(
        default=None, description="ported-as <patch id> | not-needed <reason> | deferred")
    note: str | None = None

    @property
    def decided(self) -> bool:
        return self.resolution is not None

    @property
    def ported_as(self) -> str | None:
        r = self.resolution or ""
        return r.split(" ", 1)[1] if r.startswith("ported-as ") else None

    def matches(self, sha: str) -> bool:
        return sha.startswith(self.sha)

    def summary(self) -> str:
        bits = [b for b in (self.tier, self.resolution) if b]
        return ", ".join(bits) + (f" ({self.note})" if self.note else "") if bits else (self.note or "")


class Deviation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    patch: Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")]
    upstream: Annotated[str, StringConstraints(pattern=r"^(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]+#[1-9][0-9]*$")] | None = None
    why: str = Field(min_length=1)
    discharge: Annotated[str, StringConstraints(pattern=_REF)] | None = Field(
        default=None, description="the upstream commit (sha or vllm#N) that makes the deviation unnecessary")
    paths: list[str] = Field(default_factory=list, description="files it lives in (default: the patch's files)")
    reviewed: str | None = Field(default=None, description="the target (version or sha) it was last reviewed for")

    def discharged_by(self, sha: str, subject: str) -> bool:
        d = self.discharge
        if not d:
            return False
        if "#" in d:
            from .reverts import pr_numbers

            return int(d.rsplit("#", 1)[1]) in pr_numbers(subject)
        return sha.startswith(d)


class Decisions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    decisions: list[Decision] = Field(default_factory=list)
    deviations: list[Deviation] = Field(default_factory=list)
    sentinel: Literal["complete"] = Field(alias=SENTINEL_KEY)  # SENTINEL_VALUE (a Literal takes no names)

    def to_data(self) -> dict:
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    def for_sha(self, sha: str) -> Decision | None:
        hits = [d for d in self.decisions if d.matches(sha)]
        return hits[0] if hits else None

    def deviation(self, patch: str) -> Deviation | None:
        for d in self.deviations:
            if d.patch == patch:
                return d
        return None


EMPTY = ("# Human decisions on the sync queue, keyed by upstream commit sha, and the deviations of the\n"
         "# local tree from upstream. Edit with `python -m sndr sync decide` / `sync deviation`;\n"
         "# comments and formatting survive every edit.\n"
         "decisions: []\ndeviations: []\n__sentinel__: complete\n")


def default_decisions_path() -> Path:
    """``<patch dir>/sync-decisions.yaml``; the patch dir is :func:`sndr.env.patches_dir`."""
    from ..env import patches_dir

    return patches_dir() / DECISIONS_NAME


@dataclass
class LoadedDecisions:
    model: Decisions
    text: str
    file: str


def parse_decisions(text: str, file: str = "<decisions>") -> LoadedDecisions:
    raw = load_rt(text, file)
    if not isinstance(raw, dict):
        raise bad_input("bad_decisions", "the decisions file is a mapping with 'decisions', 'deviations' and "
                        f"'{SENTINEL_KEY}'", file=file, line=1)
    if SENTINEL_KEY not in raw or list(raw)[-1] != SENTINEL_KEY:
        raise bad_input("bad_decisions", f"'{SENTINEL_KEY}: {SENTINEL_VALUE}' must be the last line: the file is "
                        "truncated or incomplete", file=file, key=SENTINEL_KEY)
    try:
        model = Decisions.model_validate(to_plain(raw))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [p for p in err.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p == "str"))]
            line = None
            try:
                node = raw[loc[0]][loc[1]]
                line = (node.lc.key(loc[2])[0] if len(loc) > 2 and loc[2] in node else node.lc.line) + 1
            except (KeyError, IndexError, TypeError, AttributeError):
                pass
            where = ".".join(str(p) for p in loc)
            problems.append(Problem("bad_decisions", f"{where}: {err.get('msg')} (got {err.get('input')!r})",
                                    file=file, line=line, key=where or None))
        raise SndrError(problems) from None
    seen: dict[str, int] = {}
    for i, d in enumerate(model.decisions):
        for s, j in seen.items():
            if s.startswith(d.sha) or d.sha.startswith(s):
                raise bad_input("bad_decisions", f"decisions[{i}] {d.sha} and decisions[{j}] {s} name the same "
                                "commit; keep one", file=file, key=f"decisions.{i}.sha")
        seen[d.sha] = i
    return LoadedDecisions(model, text, file)


def load_decisions(path: Path | str | None = None, *, missing_ok: bool = True) -> LoadedDecisions:
    """The decisions file (an empty one when it does not exist and ``missing_ok``)."""
    from .watchlist import read_text_file

    path = Path(path) if path is not None else default_decisions_path()
    if not path.exists() and missing_ok:
        return parse_decisions(EMPTY, str(path))
    return parse_decisions(read_text_file(path, "decisions file"), str(path))


# ----------------------------------------------------------------------------- editing


def _set_row(text: str, file: str, section: str, index: int | None, row: dict, model, label: str) -> str:
    """Set the keys of ``row`` on row ``index`` of ``section`` (append the row when ``index`` is None)."""
    loaded = parse_decisions(text, file)
    expected = loaded.model.to_data()
    expected.setdefault(section, [])
    order = list(model.model_fields)
    if index is None:
        expected[section] = list(expected[section]) + [row]
        new = append_row(text, section, row, order)
    else:
        merged = {**expected[section][index], **row}
        expected[section] = list(expected[section])
        expected[section][index] = merged
        new = text
        for key, value in row.items():
            root = rt_yaml().compose(new)
            new = splice_field(new, row_node(root, section, index), key, value, order)
    return checked(new, expected, lambda t: parse_decisions(t, file).model.to_data(), label, file)


def set_decision(text: str, sha: str, file: str = "<decisions>", **fields: Any) -> tuple[str, Decision]:
    """Record (or update) the decision on ``sha``; ``fields``: subject, tier, resolution, note (None: unchanged)."""
    fields = {k: v for k, v in fields.items() if v is not None}
    loaded = parse_decisions(text, file)
    index = next((i for i, d in enumerate(loaded.model.decisions) if d.matches(sha) or sha.startswith(d.sha)
                  or d.sha.startswith(sha)), None)
    row = dict(fields)
    if index is None:
        row = {"sha": sha, **fields}
    elif len(sha) > len(loaded.model.decisions[index].sha):
        row["sha"] = sha  # a longer sha names the commit more precisely
    try:
        Decision.model_validate({**(loaded.model.decisions[index].model_dump(exclude_none=True)
                                    if index is not None else {}), **row})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        raise bad_input("bad_decisions", f"{key}: {err.get('msg')} (got {err.get('input')!r})", key=key,
                        hint="tier: PORT-NOW|INVENTORY|IGNORE; resolution: 'ported-as PN0123', "
                        "'not-needed <reason>' or 'deferred'") from None
    new = _set_row(text, file, "decisions", index, row, Decision, f"decision {sha[:10]}")
    return new, parse_decisions(new, file).model.for_sha(sha) or Decision(sha=sha)


def set_deviation(text: str, patch: str, file: str = "<decisions>", **fields: Any) -> str:
    fields = {k: v for k, v in fields.items() if v is not None}
    loaded = parse_decisions(text, file)
    index = next((i for i, d in enumerate(loaded.model.deviations) if d.patch == patch), None)
    row = dict(fields) if index is not None else {"patch": patch, **fields}
    try:
        Deviation.model_validate({**(loaded.model.deviations[index].model_dump(exclude_none=True)
                                    if index is not None else {}), **row})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ()))
        raise bad_input("bad_decisions", f"deviation {patch}: {key}: {err.get('msg')}", key=key,
                        hint="a new deviation needs --why; --upstream is vllm#N; --discharge is a sha or vllm#N") from None
    return _set_row(text, file, "deviations", index, row, Deviation, f"deviation {patch}")


def drop_deviation(text: str, patch: str, file: str = "<decisions>") -> str:
    loaded = parse_decisions(text, file)
    index = next((i for i, d in enumerate(loaded.model.deviations) if d.patch == patch), None)
    if index is None:
        raise bad_input("bad_decisions", f"no deviation for {patch}", file=file, key="deviations")
    expected = loaded.model.to_data()
    expected["deviations"] = [r for i, r in enumerate(expected["deviations"]) if i != index]
    new = remove_row(text, "deviations", index)
    return checked(new, expected, lambda t: parse_decisions(t, file).model.to_data(), f"deviation {patch}", file)


def deviation_set(decisions: Decisions, patch_files: dict[str, list[str]]) -> list[tuple[Deviation, list[str]]]:
    """Each deviation with the files it lives in (its ``paths``, else its patch's files)."""
    return [(d, list(d.paths) or list(patch_files.get(d.patch, []))) for d in decisions.deviations]
