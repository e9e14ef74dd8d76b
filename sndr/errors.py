"""Errors are values: a reason code, a message and a location.

Every problem sndr can report is a :class:`Problem`. Code that must stop raises
:class:`SndrError`, which carries one or more problems; the CLI maps the
``exit_code`` of the error to the process exit status (0 ok, 1 findings,
2 bad input, 3 internal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    file: str | None = None
    line: int | None = None
    key: str | None = None
    patch: str | None = None
    hint: str | None = None

    def render(self) -> str:
        where = self.file or ""
        if where and self.line is not None:
            where += f":{self.line}"
        if self.key:
            where += f" [{self.key}]" if where else f"[{self.key}]"
        head = f"{where}: " if where else ""
        pid = f"{self.patch}: " if self.patch and self.patch not in head else ""
        text = f"{head}{pid}{self.message} ({self.code})"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class SndrError(Exception):
    problems: list[Problem] = field(default_factory=list)
    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, problems: Problem | Iterable[Problem], exit_code: int = EXIT_BAD_INPUT):
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        self.exit_code = exit_code
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(p.render() for p in self.problems)


def bad_input(code: str, message: str, **where) -> SndrError:
    return SndrError(Problem(code, message, **where), EXIT_BAD_INPUT)
