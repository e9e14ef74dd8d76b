"""The architecture, enforced: what each package may import, no import cycles, no module sprawl.

Imports are read with :mod:`ast` from the source (function-level imports
included), so a lazy import cannot hide from these rules. The rules:

* **Core** = the top-level modules ``sndr/<name>.py``. **Startup** =
  ``sndr/startup/*``, which runs in every vLLM process.
* **Startup imports the stdlib and the core only.** Every import statement in
  ``sndr/startup/*.py``, at module level or inside a function, names a stdlib
  module, ``sndr``, a core module or another ``sndr.startup`` module. The one
  third-party exception is listed in :data:`STARTUP_THIRD_PARTY` with its reason,
  and must sit inside a function.
* **The warm path is stdlib-only.** The closure of *module-level* imports from
  the startup modules (following sndr modules' own module-level imports) holds
  no third-party module; checked in a fresh interpreter too. So ``pydantic``
  (via ``sndr.model``) is only ever reached by a function-level import, which
  runs on the cold path only (a memo miss: ``resolve.resolve_set`` loading the
  patch set); ``tests/startup/test_hook.py`` checks a warm start never runs it.
* The core never imports ``sndr.kernels`` or ``sndr.runtime_patches`` at module level.
* **Commands are the one upward arrow.** ``sndr.__main__`` and ``sndr/commands/*`` call down into the
  engines; no engine imports them. A command module imports only the stdlib and ``sndr.commands`` at module
  level (its engine inside ``run``), so every ``--help`` is light; a module's ``if __name__ == "__main__":``
  block (``python -m sndr.apply``) only hands over to ``sndr.__main__``.
* No import cycle among sndr modules, function-level imports included (an
  import inside a function is a cycle all the same, only deferred). The cycles
  that remain are listed edge by edge in :data:`CYCLE_EDGES`, each with why it
  is still there; the list may only shrink (a stale entry fails).
* The resolution's code stamp names files that exist (a moved module would
  otherwise silently stop invalidating the memo).
* No module over :data:`MAX_LINES` lines unless it is on :data:`LARGE_MODULES`,
  with the one cohesive thing it is.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from source_scan import parse

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "sndr"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

MAX_LINES = 600

#: Modules over MAX_LINES, each one cohesive thing (the reason is the comment).
LARGE_MODULES = {
    # the transaction: journal, lock, objects, the RENAME_EXCHANGE swap, crash recovery. One piece because
    # recovery undoes exactly what commit does, step by step: both run the same private replace window
    # (_Slot, _swap, _restore, _read_settled, _tree_dir), which a split would turn into a cross-module API
    # (tested as one in tests/test_commit.py)
    "sndr/commit.py",
    # the planner: gates, after/requires order, stacked edits, conflict and on_failure re-planning; one pure
    # build_plan whose re-planning loop (_plan_once, _settle_conflicts) needs every step's simulated file state
    "sndr/plan.py",
    # the apply/verify/revert shell; the ledger checks share its helpers (its CLI: sndr/commands/apply.py)
    "sndr/apply.py",
    # PK0003's boundary with vLLM: the four drop-in entries (two Triton-baseline, two default-path) share one
    # module state (the once-per-reason refusal log, the scope and capability caches, the per-layout plan
    # cache) and one cell check (_cell_taken: routing table, canary, CUDA or Triton step), which the tests
    # reset and patch as one; a split would make that state a cross-module API
    "sndr/kernels/gdn/vllm_entry.py",
}

#: Function-level imports that close an import cycle today: (importer, imported) -> why it is still there.
#: Only a function-level import can be listed (a module-level cycle always fails); an entry whose import is
#: gone, or no longer closes a cycle, fails too.
CYCLE_EDGES: dict[tuple[str, str], str] = {}

#: Third-party imports allowed in sndr/startup, each inside a function only: (file, top-level module) -> why.
STARTUP_THIRD_PARTY = {
    ("sndr/startup/metrics.py", "prometheus_client"):
        "vLLM's own metrics library: imported only when it is already loaded or PROMETHEUS_MULTIPROC_DIR is set",
}


# ----------------------------------------------------------------------------- import graph


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if "_data" in p.parts:
            continue
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()
CORE = {m for m, p in MODULES.items() if p.parent == PKG and p.name != "__init__.py"}


def _targets(mod: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute module names an import statement imports (``from a import b``: ``a`` and, if a module, ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in MODULES]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_guard(test: ast.expr) -> bool:
    """``if __name__ == "__main__":``"""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _main_blocks(path: Path) -> list[ast.If]:
    """The module-level ``if __name__ == "__main__":`` blocks of a file (what runs only as ``python -m``)."""
    return [n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.If)
            and _is_main_guard(n.test)]


def _imports(path: Path, *, type_checking: bool = True) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of a file, with True when it runs at import time (module level).
    ``type_checking=False`` leaves out the ``if TYPE_CHECKING:`` blocks (they never run). A module-level
    ``if __name__ == "__main__":`` block is left out too: it runs only when the module is the program, never
    when it is imported (:func:`test_a_main_block_only_hands_over_to_the_dispatcher` checks what it imports)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def walk(nodes: list[ast.stmt], top: bool) -> None:
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                out.append((n, top))
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(n.body, False)
            elif isinstance(n, ast.If) and top and _is_main_guard(n.test):
                continue
            elif isinstance(n, ast.If) and _is_type_checking(n.test):
                if type_checking:
                    walk(n.body, False)  # never runs
                walk(n.orelse, top)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    sub = getattr(n, field, None)
                    if isinstance(sub, list):
                        walk([s for s in sub if isinstance(s, ast.stmt)], top)
                        for h in sub:
                            if isinstance(h, (ast.ExceptHandler, ast.match_case)):
                                walk(h.body, top)

    walk(parse(path).body, True)
    return out


def _graph(*, module_level: bool) -> dict[str, set[str]]:
    """sndr module -> the sndr modules it imports: at module level only, or every import that can run
    (function level included, ``if TYPE_CHECKING:`` left out)."""
    graph: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        deps = set()
        for node, top in _imports(path, type_checking=False):
            if top or not module_level:
                deps.update(t for t in _targets(mod, path, node) if t in MODULES and t != mod)
        graph[mod] = deps
    return graph


@functools.cache
def graph() -> dict[str, set[str]]:
    """The module-level import graph, built on first use (not at collection: only the worker that runs these
    tests pays for reading the package)."""
    return _graph(module_level=True)


@functools.cache
def full_graph() -> dict[str, set[str]]:
    """Every import that can run, function level included (the cycle graph), built on first use."""
    return _graph(module_level=False)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


# ----------------------------------------------------------------------------- the rules


STARTUP = sorted(m for m in MODULES if m == "sndr.startup" or m.startswith("sndr.startup."))


@pytest.mark.parametrize("mod", STARTUP)
def test_startup_imports_only_the_stdlib_and_the_core(mod):
    path = MODULES[mod]
    rel = path.relative_to(REPO).as_posix()
    bad = []
    for node, top in _imports(path):
        for target in _targets(mod, path, node):  # the module it names, and the sndr modules it takes
            head = target.split(".")[0]
            if head in STDLIB:
                continue
            if head == "sndr":
                ok = target == "sndr" or target.startswith("sndr.startup") or \
                    ".".join(target.split(".")[:2]) in CORE
                if not ok:
                    bad.append(f"line {node.lineno}: {target} is neither the core nor sndr.startup")
                continue
            why = STARTUP_THIRD_PARTY.get((rel, head))
            if why is None:
                bad.append(f"line {node.lineno}: third-party {target}")
            elif top:
                bad.append(f"line {node.lineno}: {target} is allowed only inside a function ({why})")
    assert not bad, f"{rel} runs in every vLLM process; it may import only the stdlib and the core:\n" + "\n".join(bad)


def _closure(start: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(graph().get(m, ()))
    return seen


def test_the_warm_startup_path_imports_no_third_party_module_at_module_level():
    reached = _closure(STARTUP)
    third = {}
    for mod in sorted(reached):
        path = MODULES[mod]
        for node, top in _imports(path):
            if not top:
                continue
            for target in _targets(mod, path, node):
                head = target.split(".")[0]
                if head not in STDLIB and head != "sndr":
                    third.setdefault(mod, []).append(f"line {node.lineno}: {target}")
    assert not third, ("the module-level imports of sndr.startup reach third-party modules (pydantic is for the "
                       f"cold path, behind a function-level import): {json.dumps(third, indent=1)}")


def test_importing_every_startup_module_loads_only_the_stdlib_and_sndr():
    """The same rule measured: a fresh interpreter imports all of sndr.startup; what did it load?"""
    code = ("import sys; before = set(sys.modules)\n"
            f"for m in {STARTUP!r}: __import__(m)\n"
            "import json; print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    foreign = [m for m in loaded if m.split(".")[0] not in STDLIB and m.split(".")[0] != "sndr"]
    assert not foreign, f"importing sndr.startup loaded {foreign}"
    assert "sndr.model" not in loaded and "sndr.plan" not in loaded and "pydantic" not in loaded


def test_the_core_never_imports_kernels_or_runtime_patches_at_module_level():
    bad = {m: sorted(d for d in graph()[m] if d.startswith(("sndr.kernels", "sndr.runtime_patches")))
           for m in sorted(CORE | {"sndr"})}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"core modules import kernels/runtime patches at module level: {bad}"


COMMAND_LAYER = {m for m in MODULES if m == "sndr.__main__" or m == "sndr.commands" or m.startswith("sndr.commands.")}


def test_only_the_dispatcher_and_the_commands_import_the_command_layer():
    """The one upward arrow: ``sndr.__main__`` and ``sndr/commands/*`` call down into the engines; no engine
    imports a command or the dispatcher, at module or function level."""
    bad = {m: sorted(d for d in full_graph()[m] if d in COMMAND_LAYER)
           for m in sorted(MODULES) if m not in COMMAND_LAYER}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"engines import the command layer (only __main__ and sndr.commands may): {bad}"


@pytest.mark.parametrize("mod", sorted(m for m in COMMAND_LAYER if m.startswith("sndr.commands.")))
def test_a_command_module_imports_its_engine_inside_run(mod):
    """A command's module-level imports are the stdlib and ``sndr.commands``: its parser costs no engine import
    (``--help`` and a usage error), and it has ``HELP``, ``add_arguments`` and ``run``."""
    path = MODULES[mod]
    top = sorted({t for node, is_top in _imports(path, type_checking=False) if is_top
                  for t in _targets(mod, path, node)[:1]
                  if t.split(".")[0] not in STDLIB and t != "sndr.commands"})
    assert not top, f"{mod} imports {top} at module level: import the engine inside run()"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert {"HELP", "add_arguments", "run"} <= names, f"{mod} lacks {sorted({'HELP', 'add_arguments', 'run'} - names)}"
    # ... and inside the boundary: run() itself imports only sndr.cli (and the stdlib); the engine is imported
    # in the body cli.run calls, so an import failure or a refused output is the boundary's exit status and
    # line, and an error found before the work never loads the engine.
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    own: list[ast.stmt] = list(run.body)
    outside = []
    while own:
        node = own.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # the body cli.run calls
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            outside += [f"line {node.lineno}: {t}" for t in _targets(mod, path, node)[:1]
                        if t.split(".")[0] not in STDLIB and t != "sndr.cli"]
        own.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt))
    assert not outside, f"{mod}.run imports {outside} outside the body it hands to sndr.cli.run"


def test_every_command_is_in_the_table_and_every_table_entry_is_a_command():
    from sndr.commands import COMMANDS

    files = {m for m in COMMAND_LAYER if m.startswith("sndr.commands.")}
    assert {module for module, _ in COMMANDS.values()} == files


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_a_main_block_only_hands_over_to_the_dispatcher(mod):
    """``python -m sndr.apply`` is an alias: a module's ``if __name__ == "__main__":`` block imports only
    ``sndr.__main__`` (the one parser and run) and the stdlib, never a second entry point of its own."""
    path = MODULES[mod]
    for block in _main_blocks(path):
        targets = {t for n in ast.walk(block) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for t in _targets(mod, path, n)[:1] if t.split(".")[0] not in STDLIB}
        assert mod == "sndr.__main__" or targets <= {"sndr.__main__"}, f"{mod}'s __main__ block imports {targets}"


def _import_lines(mod: str, targets: set[str]) -> list[str]:
    """``line N (function|module level): target`` for each import of ``mod`` that takes one of ``targets``."""
    path = MODULES[mod]
    return [f"line {node.lineno} ({'module' if top else 'function'} level): {t}"
            for node, top in _imports(path, type_checking=False)
            for t in _targets(mod, path, node) if t in targets and t != mod]


def _without(graph: dict[str, set[str]], edges) -> dict[str, set[str]]:
    return {m: {d for d in deps if (m, d) not in edges} for m, deps in graph.items()}


def test_no_import_cycles_among_sndr_modules():
    """Function-level imports count: the only cycles left are the edges of CYCLE_EDGES, each with its reason."""
    cycles = _cycles(_without(full_graph(), CYCLE_EDGES))
    detail = []
    for comp in cycles:
        detail.append(" <-> ".join(comp) + ":\n" + "\n".join(
            f"  {m} {ln}" for m in comp for ln in _import_lines(m, set(comp))))
    assert not cycles, ("import cycles (function-level imports included; break them, or list the edge in "
                        "CYCLE_EDGES with why it stays):\n" + "\n".join(detail))


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return False


def test_each_allowed_cycle_edge_is_a_function_level_import_that_still_closes_a_cycle():
    """Every CYCLE_EDGES entry (none today: the list only shrinks) is a function-level import that still closes
    a cycle, with its reason."""
    for edge in sorted(CYCLE_EDGES):
        src, dst = edge
        assert CYCLE_EDGES[edge].strip(), f"CYCLE_EDGES[{edge}] needs its reason"
        assert dst in full_graph().get(src, set()), f"{src} no longer imports {dst}: drop the CYCLE_EDGES entry"
        assert dst not in graph()[src], (f"{src} imports {dst} at module level ({_import_lines(src, {dst})}): "
                                         "a module-level cycle is never allowed")
        others = _without(full_graph(), set(CYCLE_EDGES) - {edge})
        assert _reaches(others, dst, src), f"{src} -> {dst} closes no cycle any more: drop the CYCLE_EDGES entry"


def test_the_cycle_finder_finds_a_cycle():
    """The check above is only as good as the finder: a two-module and a three-module cycle, and a DAG."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_import_reader_sees_function_level_and_relative_imports():
    src = PKG / "startup" / "resolve.py"
    found = {(t, top) for node, top in _imports(src) for t in _targets("sndr.startup.resolve", src, node)[:1]}
    assert ("sndr.load", False) in found  # `from ..load import load_patch_set` inside resolve_set
    assert ("os", True) in found
    # the cycle graph takes function-level imports and leaves out `if TYPE_CHECKING:` ones
    assert "sndr.load" in full_graph()["sndr.startup.resolve"]
    assert "sndr.load" not in graph()["sndr.startup.resolve"]
    revs = PKG / "upstream" / "reverts.py"
    assert any(t == "sndr.upstream.gitio" for node, _ in _imports(revs)
               for t in _targets("sndr.upstream.reverts", revs, node))
    assert "sndr.upstream.gitio" not in full_graph()["sndr.upstream.reverts"]  # CommitInfo, annotations only


def test_the_code_stamp_names_modules_that_exist():
    from sndr.startup import resolve

    root = Path(resolve.package_root())
    assert root == PKG
    missing = [name for name in resolve.STAMP_MODULES if not (root / name).is_file()]
    assert not missing, f"resolve.STAMP_MODULES names missing files {missing}: memo invalidation would be off"
    # Every core module the resolution runs is stamped: a change to it must invalidate the memo.
    stamped = set(resolve.STAMP_MODULES)
    for name in ("startup/resolve.py", "startup/importer.py", "startup/hookcache.py", "startup/common.py"):
        assert name in stamped
    for name in ("model.py", "load.py", "plan.py", "classify.py", "env.py", "packs.py", "state.py", "profile.py"):
        assert name in stamped
    # The CLI shell decides nothing a process resolves: editing --help must not send every vLLM process
    # down the cold path (tests/test_importer.py measures the fingerprint).
    assert "apply.py" not in stamped


def test_modules_over_the_size_limit_are_on_the_allow_list():
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in MODULES.values()}
    over = sorted(rel for rel, n in sizes.items() if n > MAX_LINES)
    unlisted = [f"{rel} ({sizes[rel]} lines)" for rel in over if rel not in LARGE_MODULES]
    assert not unlisted, (f"modules over {MAX_LINES} lines: split them at their seams, or add them to "
                          f"LARGE_MODULES with the one cohesive thing each is: {unlisted}")
    gone = sorted(rel for rel in LARGE_MODULES if rel not in sizes)
    assert not gone, f"LARGE_MODULES names modules that no longer exist: {gone}"


def _commands() -> list[str]:
    from sndr.commands import COMMANDS

    return sorted(COMMANDS)


@pytest.mark.parametrize("argv", [["sndr", "schema", "codes"], ["sndr", "--help"], ["sndr.apply", "--help"]]
                         + [["sndr", name, "--help"] for name in _commands()])
def test_light_subcommands_never_import_the_models_or_the_renderer(argv):
    """Each subcommand imports only what it needs: ``schema codes`` reads the code table, never a model; and
    every command's ``--help`` (a parser, nothing else) never imports the engine that command runs."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "sndr" in imported, "the -X importtime output was not read"
    heavy = sorted(imported & {"pydantic", "sndr.model", "sndr.plan", "sndr.load", "sndr.commit", "rich",
                               "packaging"})
    assert not heavy, f"python -m {' '.join(argv)} imported {heavy}"


@pytest.mark.parametrize("argv, engine", [
    (["status", "--json", "{dir}"], "sndr.startup.hook"),
    (["list", "--json", "{dir}"], "sndr.listing"),
    (["watchlist", "lint", "--json", "{dir}"], "sndr.upstream.watchlist"),
    (["import", "quilt", "{dir}", "--to", "{dir}/out", "--json", "{dir}"], "sndr.upstream.series"),
    (["preflight", "--pin", "vllm==0.32.0", "--candidate", "vllm==0.33.0", "--markdown", "{dir}"], "pydantic"),
])
def test_an_output_refused_before_the_work_never_imports_the_engine(argv, engine, tmp_path):
    """A refused ``--json`` (a directory) is found before any work: the command stops at its boundary (exit 2,
    output_refused) without importing its engine (status imported sndr.startup.hook before the check)."""
    argv = [a.format(dir=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sndr", *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "output_refused" in proc.stderr, proc.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "sndr.cli" in imported, "the -X importtime output was not read"
    assert engine not in imported, f"python -m sndr {' '.join(argv)} imported {engine} before refusing --json"
