"""A test harness for patch authors: plan one patch file on given texts and assert what it does.

In the spirit of LibCST's ``CodemodTest.assertCodemod``::

    from sndr.testing import assert_patch

    def test_clamp():
        assert_patch(
            "patches/PN0007-clamp.toml",
            before={"vllm/v1/core/kv_cache_coordinator.py": "...\\n        curr_hit_length = hit_length\\n..."},
            after={"vllm/v1/core/kv_cache_coordinator.py": "...\\n        curr_hit_length = min(hit_length, max_hit)\\n..."},
            verdicts={"clamp": "applies"},
        )

On the real pinned vLLM tree (fetched once into sndr's cache by
:func:`sndr.tree.fetch_version`, the code ``--tree vllm==X`` uses), with the
``sndr_patch_on_pin`` fixture; enable it with ``pytest_plugins = ["sndr.testing"]``
in your ``conftest.py``::

    def test_clamp_on_the_pin(sndr_patch_on_pin):
        sndr_patch_on_pin("patches/PN0007-clamp.toml", verdicts={"clamp": "applies"},
                          contains={"vllm/v1/core/kv_cache_coordinator.py": ["min(hit_length, max_hit)"]})

The patch is planned by the very planner ``apply`` runs (:func:`sndr.plan.build_plan`),
alone, hermetically: the environment is empty except the patch's own
``SNDR_ENABLE_<ID>=1`` (so a ``default = false`` patch is tested too), no
deployment profile, and every changed ``.py`` file is compiled: a compile error fails
the assertion whatever else is asked (``check_compile=False`` to skip). By default the
harness also re-plans on the patched texts and requires every edit to read
``applied`` (or ``merged``) and nothing to change: apply, then verify.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from .model import Patch, PatchResult
    from .plan import Plan

__all__ = ["PatchCheck", "assert_patch", "load_patch", "plan_patch", "reader", "patched_texts", "verdicts_on",
           "sndr_pin_tree", "sndr_patch_on_pin"]

#: A patch under test: a Patch, a path to its TOML file, or the TOML text itself.
PatchLike = Union["Patch", str, os.PathLike[str]]
Texts = Mapping[str, str | None]

_AFTER_APPLY = {"applied", "merged"}


def load_patch(patch: PatchLike) -> Patch:
    """A :class:`~sndr.model.Patch` from a Patch, a ``.toml`` path or TOML text (validated like ``apply`` does)."""
    from .load import load_patch_file, parse_patch
    from .model import Patch

    if isinstance(patch, Patch):
        return patch
    if isinstance(patch, os.PathLike) or ("\n" not in patch and patch.endswith(".toml")):
        return load_patch_file(Path(patch))
    return parse_patch(patch, "<test>")


def reader(files: Texts, fallback: Callable[[str], str | None] | None = None) -> Callable[[str], str | None]:
    """A planner's read function over ``{path: text}`` (None or absent: the file does not exist)."""

    def read(rel: str) -> str | None:
        if rel in files:
            return files[rel]
        return fallback(rel) if fallback is not None else None

    return read


def _environ(patch: Patch, environ: Mapping[str, str] | None) -> dict[str, str]:
    from .env import enable_var

    if environ is not None:
        return dict(environ)
    return {enable_var(patch.id): "1"}


def plan_patch(patch: PatchLike, files: Texts, *, version: str | None = None, environ: Mapping[str, str] | None = None,
               check_compile: bool = True, fallback: Callable[[str], str | None] | None = None) -> Plan:
    """The plan of one patch on ``files`` (the planner ``apply`` runs, alone and hermetic)."""
    from . import PIN_VERSION
    from .load import PatchSet
    from .plan import build_plan

    p = load_patch(patch)
    return build_plan(PatchSet(patches=[p]), reader(files, fallback), version or PIN_VERSION,
                      environ=_environ(p, environ), check_compile=check_compile)


def patched_texts(patch: PatchLike, files: Texts, **kw: Any) -> dict[str, str]:
    """``{path: new text}`` of every file the patch changes; fails on any plan problem."""
    plan = plan_patch(patch, files, **kw)
    assert not plan.problems, "\n".join(p.render() for p in plan.problems)
    return {rel: ch.new for rel, ch in plan.changes.items()}


def verdicts_on(patch: PatchLike, files: Texts, **kw: Any) -> dict[str, str]:
    """``{edit name: verdict}`` of one patch on ``files``."""
    plan = plan_patch(patch, files, **kw)
    return {e.name: e.verdict.value for r in plan.patches for e in r.edits}


def _diff(rel: str, want: str, got: str) -> str:
    return "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"expected/{rel}",
                                        f"patched/{rel}"))


def _explain(result: PatchResult) -> str:
    rows = [f"  {e.name}: {e.verdict.value}" + (f" ({e.reason})" if e.reason else "") for e in result.edits]
    return f"{result.id}: {result.status}" + (f" ({result.reason})" if result.reason else "") + "\n" + "\n".join(rows)


def assert_patch(patch: PatchLike, before: Texts, after: Mapping[str, str] | None = None,
                 verdicts: Mapping[str, str] | None = None, *, status: str | None = None,
                 contains: Mapping[str, Sequence[str]] | None = None, version: str | None = None,
                 environ: Mapping[str, str] | None = None, check_compile: bool = True, reapply: bool = True,
                 fallback: Callable[[str], str | None] | None = None) -> PatchResult:
    """Plan ``patch`` on ``before`` and assert what it does; returns its :class:`~sndr.model.PatchResult`.

    * ``after``: ``{path: text}`` of every file the patch changes, exactly (a
      unified diff on mismatch). A file it changes that ``after`` does not name
      fails, unless ``after`` is None (not checked).
    * ``verdicts``: ``{edit name: verdict}`` (``applies``, ``merged``,
      ``drifted``, ...; see README "Verdicts"), for the edits named.
    * ``status``: the patch's status (``applies``, ``merged``, ``gated``,
      ``failed``, ...). Default: ``applies`` when ``after`` is given.
    * ``contains``: ``{path: [snippet, ...]}`` each present in the patched text
      (for real trees, where a whole ``after`` text is too long to write).
    * ``reapply``: plan again on the patched texts; every edit must then read
      ``applied``/``merged`` and nothing may change (idempotent by content).
    * ``fallback``: read files ``before`` does not name from here (a real tree).
    """
    p = load_patch(patch)
    kw: dict[str, Any] = {"version": version, "environ": environ, "check_compile": check_compile}
    plan = plan_patch(p, before, fallback=fallback, **kw)
    [result] = [r for r in plan.patches if r.id == p.id]
    want_status = status if status is not None else ("applies" if after is not None or contains else None)
    problems = "\n".join(x.render() for x in plan.problems)
    if check_compile:  # whatever else is asserted (``verdicts=`` alone too): apply refuses what does not compile
        broken = [x.render() for x in plan.problems if x.code == "compile_error"]
        assert not broken, "the patched file does not compile (apply refuses it: compile_error):\n" + "\n".join(broken)
    if want_status is not None:
        assert result.status == want_status, \
            f"status {result.status!r}, expected {want_status!r}\n{_explain(result)}\n{problems}"
    if want_status == "applies":  # a compile error or an overlap is a problem of the plan, not a status
        assert not plan.problems, f"the plan has problems:\n{problems}"
    if verdicts:
        got = {e.name: e.verdict.value for e in result.edits}
        unknown = sorted(set(verdicts) - set(got))
        assert not unknown, f"the patch has no edit named {unknown}; its edits: {sorted(got)}"
        want_of = {name: str(getattr(want, "value", want)) for name, want in verdicts.items()}
        wrong = {name: (got[name], want) for name, want in want_of.items() if got[name] != want}
        assert not wrong, "edit verdicts (got, expected): " + repr(wrong) + "\n" + _explain(result)
    new = {rel: ch.new for rel, ch in plan.changes.items()}
    if after is not None:
        extra = sorted(set(new) - set(after))
        assert not extra, f"the patch also changes {extra}, which `after` does not name"
        for rel, want in after.items():
            got_text = new.get(rel, before.get(rel))
            assert got_text == want, f"{rel} after the patch differs:\n" + _diff(rel, want, got_text or "")
    for rel, snippets in (contains or {}).items():
        assert rel in new, f"the patch does not change {rel} (it changes {sorted(new)})"
        missing = [s for s in snippets if s not in new[rel]]
        assert not missing, f"{rel} after the patch lacks {missing}"
    if reapply and new and not plan.problems:
        again = plan_patch(p, {**before, **new}, fallback=fallback, **kw)
        [r2] = [r for r in again.patches if r.id == p.id]
        first = {e.name: e.verdict.value for e in result.edits}
        # What applied must now read applied (or merged); an optional edit that was absent stays absent.
        # A runtime binding is not read from the text (each vLLM process installs it): it must still apply.
        bad = {e.name: e.verdict.value for e in r2.edits
               if first.get(e.name) == "applies" and e.verdict.value not in _AFTER_APPLY
               and not (e.binding and e.verdict.value == "applies")}
        assert (r2.status in _AFTER_APPLY or r2.applies_at_startup_only()) and not bad, \
            f"re-planned on its own output the patch reads {r2.status} ({bad})\n{_explain(r2)}"
        changed = sorted(rel for rel, ch in again.changes.items() if ch.new != new.get(rel))
        assert not changed, f"re-planned on its own output the patch changes {changed} again (not idempotent)"
    return result


# ----------------------------------------------------------------------------- pytest fixtures


class PatchCheck:
    """``sndr_patch_on_pin(patch, ...)``: :func:`assert_patch` on the real pinned vLLM tree."""

    def __init__(self, root: Path, version: str):
        from .tree import open_tree

        self.root, self.version = root, version
        self.tree = open_tree(root)

    def read(self, rel: str) -> str | None:
        text: str | None = self.tree.read_text(rel)
        return text

    def __call__(self, patch: PatchLike, before: Texts | None = None, **kw: Any) -> PatchResult:
        kw.setdefault("version", self.version)
        return assert_patch(patch, dict(before or {}), fallback=self.read, **kw)


def _pytest_fixtures() -> tuple[Any, Any]:
    import pytest

    @pytest.fixture(scope="session")
    def sndr_pin_tree() -> Path:
        """Read-only root (contains ``vllm/``) of the pinned vLLM, fetched once into sndr's cache."""
        from . import PIN_VERSION
        from .tree import fetch_version

        root: Path = fetch_version(PIN_VERSION)
        return root

    @pytest.fixture(scope="session")
    def sndr_patch_on_pin(sndr_pin_tree: Path) -> Iterator[PatchCheck]:
        """:func:`assert_patch` with ``before`` read from the pinned vLLM tree."""
        from . import PIN_VERSION

        yield PatchCheck(sndr_pin_tree, PIN_VERSION)

    return sndr_pin_tree, sndr_patch_on_pin


try:  # a pytest plugin when pytest is importable (`pytest_plugins = ["sndr.testing"]`); plain helpers otherwise
    sndr_pin_tree, sndr_patch_on_pin = _pytest_fixtures()
except ImportError:  # pragma: no cover - pytest is a test dependency only
    pass
