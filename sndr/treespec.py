"""What a tree spec names, parsed once; and the "``vllm/`` or its parent" rule. Stdlib only.

Every command that takes ``--tree`` reads it here: :func:`sndr.tree.open_tree`
(a read-only view of any form), :func:`sndr.tree.directory` (the directory a
writing command may use, and why not) and the ``--verify`` fast path
(:func:`plain_dir`, in :mod:`sndr.startup.verify`), which runs in a warm
process and so imports nothing but the stdlib.

The forms, in the order they are tried:

* ``installed`` / ``installed:PYTHON``: the vLLM that interpreter imports;
* ``vllm==X`` (any ``vllm<op>X``; only an exact version opens): a published release;
* ``git:REPO@REV`` / ``git:REPO``: a revision of a checkout;
* anything else is a path (a directory, ``vllm/`` itself, or a ``.whl``), or, when no
  such path exists, ``REPO@REV`` of a checkout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

__all__ = ["PKG", "SPEC_FORMS", "Spec", "parse", "plain_dir", "vllm_root"]

#: The package every tree holds at its root.
PKG = "vllm"
#: What ``--tree`` takes, as the messages say it.
SPEC_FORMS = (
    "a directory that contains vllm/, a .whl file, 'vllm==X.Y.Z', "
    "'git:REPO@REV', or 'installed[:/path/to/python]'"
)
#: ``vllm<op>VERSION``; a tree needs ``==`` (or ``===``), the other operators are named as an error.
VERSION_SPEC = re.compile(r"^\s*vllm\s*(?P<op>[=<>!~]{1,3})\s*(?P<ver>\S+)\s*$", re.I)


class Spec(NamedTuple):
    """A parsed spec: ``kind`` is ``installed``, ``version``, ``git`` or ``path``; ``text`` the spec stripped.

    ``arg``: the interpreter (``installed``; empty for this one), the version (``version``), what follows
    ``git:`` (``git``) or the path text (``path``). ``op``: the version's operator (``version`` only).
    """

    kind: str
    text: str
    arg: str
    op: str = ""


def parse(spec: str) -> Spec:
    """Which form ``spec`` is (see the module docstring); never touches the disk, never raises."""
    text = spec.strip()
    if text == "installed" or text.startswith("installed:"):
        return Spec("installed", text, text.partition(":")[2])
    m = VERSION_SPEC.match(text)
    if m:
        return Spec("version", text, m["ver"], m["op"])
    if text.startswith("git:"):
        return Spec("git", text, text[len("git:"):])
    return Spec("path", text, text)


def vllm_root(path: Path) -> Path | None:
    """The directory holding ``vllm/`` that ``path`` names: ``path`` itself when it contains ``vllm/``, its
    parent when ``path`` is the ``vllm/`` package (it has ``__init__.py``); else None. The one rule."""
    if (path / PKG).is_dir():
        return path
    if path.name == PKG and (path / "__init__.py").is_file():
        return path.parent
    return None


def plain_dir(spec: str) -> str | None:
    """The directory holding ``vllm/`` when ``spec`` is a plain directory path (what ``apply --tree SPEC``
    writes into, spelt as the full report prints it); None for every other form: the caller then asks
    the full code (:func:`sndr.tree.directory`), which names what is wrong."""
    parsed = parse(spec)
    if parsed.kind != "path" or not parsed.text:
        return None
    path = Path(parsed.text).expanduser()
    if path.suffix == ".whl" or not path.is_dir():
        return None
    root = vllm_root(path)
    return str(root) if root is not None else None
