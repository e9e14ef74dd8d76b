"""The tests mirror the package: each sndr module has a test file named after it (issue 29, finding 6).

``sndr/a/b.py`` has one when ``tests/`` holds ``test_b.py`` or ``test_b_<more>.py`` anywhere (a leading
underscore of the module's name is dropped: ``_boot.py`` -> ``test_boot.py``). A part split off a module,
``sndr/a/b_<part>.py`` beside ``sndr/a/b.py``, is tested in ``test_b.py`` (``vendor_place.py`` in
``test_vendor.py``, ``tree_git.py`` in ``test_tree.py``). By convention it sits in
the folder that mirrors the package (``tests/startup/`` for ``sndr/startup/``, ``tests/preflight/``,
``tests/upstream/``, ``tests/kernels/``; the core's in ``tests/`` and ``tests/core/``); this file checks
the name only. ``__init__.py`` and ``__main__.py`` are left out.

The modules without one are listed by name below. The list may only shrink: a module that gains a test
file, or goes away, must leave it (the second test fails on a stale entry), and a new module needs its
own test file (the first test fails until it has one). The command modules (``sndr/commands/<name>.py``)
are one family, tested in ``tests/test_commands.py`` (each command's behaviour in its engine's file). A module split off a larger one whose tests stay
in the whole's file is named in ``TESTED_IN`` with that file, which must import it (or the whole).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "sndr"
TESTS = REPO / "tests"

#: Modules with no test file by name today (many are tested through their callers' tests). Only shrinks.
WITHOUT_TEST_FILE = frozenset({
    # the core's homes of the rules: tested through test_one_home.py, test_codes.py, reliability/
    "sndr/_boot.py", "sndr/env.py", "sndr/errors.py", "sndr/fsio.py",
    # the core: tested through core/test_apply.py, core/test_plan.py, reliability/ and stack/
    "sndr/locate.py", "sndr/model.py", "sndr/modelconfig.py",
    "sndr/profile.py", "sndr/schema.py", "sndr/tomlwrite.py",
    # startup: the records are tested through startup/test_status_honest.py and startup/test_hook.py
    "sndr/startup/attest.py",
    # the preflight's layers: tested through preflight/test_preflight.py and its siblings
    "sndr/preflight/analysis.py", "sndr/preflight/annotations.py", "sndr/preflight/hops.py",
    "sndr/preflight/lineindex.py", "sndr/preflight/models.py",
    "sndr/preflight/snapshot.py",
    # upstream: tested through upstream/test_sync*.py, test_watchlist.py and test_vendor.py
    "sndr/upstream/decisions.py", "sndr/upstream/diff.py", "sndr/upstream/gitio.py", "sndr/upstream/judge.py",
    "sndr/upstream/lines.py", "sndr/upstream/perfgate.py", "sndr/upstream/pin.py", "sndr/upstream/queue.py",
    "sndr/upstream/report.py", "sndr/upstream/reverts.py", "sndr/upstream/treecheck.py",
    "sndr/upstream/triggers.py", "sndr/upstream/yamledit.py",
    # runtime patches: tested through patches/test_runtime_patches.py and patches/test_guard_*.py
    "sndr/runtime_patches/sampling.py", "sndr/runtime_patches/turboquant.py",
    # kernels: tested per family (kernels/test_gdn*.py, kernels/test_tq_*.py, kernels/test_canary_*.py)
    "sndr/kernels/_baseline.py",
    "sndr/kernels/gdn/_fla_op_stub.py", "sndr/kernels/gdn/_vllm_baseline.py", "sndr/kernels/gdn/kernels.py",
    "sndr/kernels/gdn/reference.py", "sndr/kernels/gdn/vllm_entry.py", "sndr/kernels/gdn/vllm_layer.py",
    "sndr/kernels/turboquant_k8v4/_interp.py",
    "sndr/kernels/turboquant_k8v4/_layout.py", "sndr/kernels/turboquant_k8v4/_vllm_baseline.py",
    "sndr/kernels/turboquant_k8v4/cuda_decode.py", "sndr/kernels/turboquant_k8v4/dispatch.py",
    "sndr/kernels/turboquant_k8v4/kernels.py", "sndr/kernels/turboquant_k8v4/reference.py",
    "sndr/kernels/turboquant_k8v4/vllm_entry.py",
})


#: Modules split off a larger one whose tests stay in the whole's file (the file must exist and import the
#: module by name, or import the whole it was split from, named here with the file).
TESTED_IN = {
    "sndr/kernels/gdn/replay.py": ("tests/kernels/test_gdn_replay.py", None),
    "sndr/kernels/gdn/routing.py": ("tests/kernels/test_gdn_routing.py", None),
    "sndr/kernels/turboquant_k8v4/cache_store.py": ("tests/kernels/test_tq_k8v4.py", None),
    "sndr/pinrecord.py": ("tests/upstream/test_sync_history.py", None),
    "sndr/preflight/configsource.py": ("tests/preflight/test_configdrift.py", None),
    "sndr/preflight/configmodels.py": ("tests/preflight/test_configdrift.py", "configdrift"),
    "sndr/preflight/configrender.py": ("tests/preflight/test_configdrift.py", "configdrift"),
    "sndr/startup/hookcache.py": ("tests/startup/test_importer.py", None),
    "sndr/startup/resolve.py": ("tests/startup/test_importer.py", None),
}


def split_entry_problem(module: str) -> str | None:
    """Why the TESTED_IN entry of ``module`` is wrong (None when its file exists and imports it)."""
    rel, whole = TESTED_IN[module]
    path = REPO / rel
    if not path.is_file():
        return f"{rel} does not exist"
    names = {Path(module).stem} | ({whole} if whole else set())
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            imported |= set((node.module or "").split(".")) | {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {part for a in node.names for part in a.name.split(".")}
    if not names & imported:
        return f"{rel} imports none of {sorted(names)}"
    return None


def modules() -> list[str]:
    """sndr's modules, as repo-relative paths (``__init__``, ``__main__`` and the data folder left out)."""
    return sorted(p.relative_to(REPO).as_posix() for p in PKG.rglob("*.py")
                  if "_data" not in p.parts and p.name not in ("__init__.py", "__main__.py"))


def file_names_of_tests() -> list[str]:
    return sorted(p.stem for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts)


def has_test_file(module: str, tests: list[str]) -> bool:
    if module.startswith("sndr/commands/"):  # the command modules, one family: tests/test_commands.py
        return "test_commands" in tests
    stem = Path(module).stem.lstrip("_")
    name = "test_" + stem
    if any(t == name or t.startswith(name + "_") for t in tests):
        return True
    whole, _, part = stem.partition("_")  # a part split off sndr/a/<whole>.py, tested in test_<whole>.py
    return bool(part) and (REPO / Path(module).parent / f"{whole}.py").is_file() and f"test_{whole}" in tests


def without_test_file() -> list[str]:
    tests = file_names_of_tests()
    return [m for m in modules() if not has_test_file(m, tests) and m not in TESTED_IN]


def test_every_module_has_a_test_file_by_name_or_is_listed():
    unlisted = [m for m in without_test_file() if m not in WITHOUT_TEST_FILE]
    assert not unlisted, ("these modules have no test file named after them (tests/**/test_<module>.py); "
                          "add one (do not list a new module):\n  " + "\n  ".join(unlisted))


def test_each_split_off_module_is_imported_by_the_file_that_tests_it():
    wrong = {m: why for m in TESTED_IN if (why := split_entry_problem(m))}
    assert not wrong, wrong
    listed_twice = sorted(set(TESTED_IN) & WITHOUT_TEST_FILE)
    assert not listed_twice, listed_twice
    named = [m for m in TESTED_IN if has_test_file(m, file_names_of_tests())]
    assert not named, f"tested by name now, leave TESTED_IN: {named}"


def test_the_list_only_shrinks():
    """An entry whose module is gone or has a test file now must leave the list."""
    missing = set(without_test_file())
    stale = sorted(WITHOUT_TEST_FILE - missing)
    assert not stale, "remove from WITHOUT_TEST_FILE (tested by name now, or gone):\n  " + "\n  ".join(stale)


def test_the_rule_reads_names_as_documented():
    tests = ["test_hook", "test_sync_history", "test_boot"]
    assert has_test_file("sndr/startup/hook.py", tests)
    assert has_test_file("sndr/upstream/sync.py", tests)  # test_sync_history.py counts for sync.py
    assert has_test_file("sndr/_boot.py", tests)
    assert not has_test_file("sndr/upstream/syncer.py", tests)  # a prefix of a name is not the name
    assert not has_test_file("sndr/hooks.py", tests)
    # a split-off part: beside its module, tested in that module's file (not in test_<module>_<more>.py)
    assert has_test_file("sndr/upstream/watchlist_lint.py", ["test_watchlist"])
    assert not has_test_file("sndr/upstream/watchlist_lint.py", ["test_watchlist_more"])
    assert not has_test_file("sndr/kernels/gdn/_vllm_baseline.py", ["test_vllm"])  # no sndr/kernels/gdn/vllm.py
    assert len(modules()) > 50 and "sndr/commit.py" in modules()
