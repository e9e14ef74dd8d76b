"""One home for every rule: the hook and the CLI resolve the same patch set, and nobody copies the rules.

For each environment variable that decides the patch set (``SNDR_PATCHES`` set,
unset, empty, pointing at an empty directory; ``SNDR_ENABLE_<ID>`` on and off;
``SNDR_PROFILE``; an installed plugin pack), four readers must agree on the
enabled ids and the digest:

* ``python -m sndr list --json --tree T`` (the CLI's listing),
* ``python -m sndr.apply --dry-run --json -`` (the planner),
* ``sndr.startup.resolve.resolve_set`` in a fresh process, cold and then warm
  from its memo (what every vLLM process attests),
* on the trees that are applied: the ledger's digest, ``register()``'s
  attestation in a fresh process, and ``apply --verify`` (exit 0).

Then three source scans: ``SNDR_*`` names are read from the environment only in
``sndr/env.py``; atomic writes (temp + ``os.replace``) happen only in
``sndr/fsio.py`` and the transaction in ``sndr/commit.py``; strict UTF-8 decoding
with its own error only in ``sndr/fsio.py``. Each exception is listed with its
reason; the ones waiting on another engineer's file are listed as PENDING and
must still exist (so a fix removes them from the list).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from hook_fixtures import REPO, Box, out_of
from sndr import packs
from sndr.__main__ import main as sndr_main
from source_scan import parse

PKG = REPO / "sndr"

EXTRA = {
    # default off: SNDR_ENABLE_F0004=1 turns it on
    "F0004-helper.toml": '''
id = "F0004"
title = "Helper triples (off by default)"
default = false

[[files]]
path = "vllm/engine.py"

[[files.edits]]
name = "helper"
anchor = "        return x * 2\\n"
replacement = "        return x * 3\\n"
''',
    # only for a deployment whose profile says quantization = "fp8"
    "F0005-fp8.toml": '''
id = "F0005"
title = "fp8 deployments only"
when = { quantization = "fp8" }

[[files]]
path = "vllm/engine.py"

[[files.edits]]
name = "build"
anchor = "        return cls()\\n"
replacement = "        return cls()  # fp8\\n"
''',
}

EXTRA["F0006-plugin.toml"] = '''
id = "F0006"
title = "A performance plugin (on by default; SNDR_PLUGINS=0 turns it off)"
kind = "plugin"
module = "sndr.startup.runtime"

[[runtime]]
name = "count-again"
target = "vllm.engine:Engine.step"
replacement = "sndr.startup.runtime:call_counter"
wrap = true
chain = true
signature = "(self, n)"
'''

PACK_INIT = '''\
from pathlib import Path
import pluggy

hookimpl = pluggy.HookimplMarker("sndr")


@hookimpl
def sndr_patch_dirs():
    return [Path(__file__).parent / "patches"]


def fixed_answer():
    return 42
'''

PACK_PATCH = '''\
id = "ONEHOME_0001"
title = "A pack's runtime patch"
kind = "runtime"

[[runtime]]
name = "r"
target = "vllm.engine:answer"
replacement = "onehome_pack:fixed_answer"
'''

RESOLVE = """
    import json, os, sys
    from sndr.startup import hookcache, resolve
    from sndr.tree import open_tree
    root = sys.argv[1]
    version = open_tree(root).version
    cache = hookcache.open_cache()
    cold = resolve.resolve_set(version, resolve.tree_identity(root), os.environ, cache)
    warm_before = "sndr.load" in sys.modules
    warm = resolve.resolve_set(version, resolve.tree_identity(root), os.environ, cache)
    out = {"cold": [cold["enabled"], cold["digest"]], "warm": [warm["enabled"], warm["digest"]]}
    if sys.argv[2] == "register":
        import vllm
        import sndr.startup.hook as h
        h.register()
        st = h._STATE
        out["register"] = [st.enabled, st.digest, st.ledger_digest, st.missing, st.problems, st.mode]
    print("OUT" + json.dumps(out))
"""

PROFILE_FP8 = 'quantization = "fp8"\n'


def _scenarios() -> list[tuple[str, dict, bool]]:
    """(name, environment changes, apply it for real). ``{box}``/``{tmp}`` are filled in per test."""
    return [
        ("patches_set", {"SNDR_PATCHES": "{box}"}, True),
        ("enable_off", {"SNDR_PATCHES": "{box}", "SNDR_ENABLE_F0001": "0"}, True),
        ("enable_on_default_off", {"SNDR_PATCHES": "{box}", "SNDR_ENABLE_F0004": "1"}, True),
        ("enable_runtime_off_words", {"SNDR_PATCHES": "{box}", "SNDR_ENABLE_F0003": "Off"}, True),
        ("plugins_off", {"SNDR_PATCHES": "{box}", "SNDR_PLUGINS": "0"}, True),
        ("plugins_off_one_on", {"SNDR_PATCHES": "{box}", "SNDR_PLUGINS": "no", "SNDR_ENABLE_F0006": "1"}, True),
        ("profile", {"SNDR_PATCHES": "{box}", "SNDR_PROFILE": "{tmp}/fp8.toml"}, True),
        ("pack", {"SNDR_PATCHES": "{box}", "PACK": "1"}, True),
        ("patches_unset", {}, False),
        ("patches_empty_string", {"SNDR_PATCHES": ""}, False),
        ("patches_empty_dir", {"SNDR_PATCHES": "{tmp}/empty"}, False),
    ]


def _make_pack(site: Path) -> None:
    (site / "onehome_pack" / "patches").mkdir(parents=True)
    (site / "onehome_pack" / "__init__.py").write_text(PACK_INIT)
    (site / "onehome_pack" / "patches" / "ONEHOME_0001-r.toml").write_text(PACK_PATCH)
    info = site / "onehome_pack-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onehome_pack\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sndr.patches]\nonehome = onehome_pack\n")


def _cli_json(capsys, argv: list[str]) -> tuple[int, dict]:
    capsys.readouterr()
    code = sndr_main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("name,changes,applied", _scenarios(), ids=[s[0] for s in _scenarios()])
def test_hook_and_cli_resolve_the_same_set_and_digest(name, changes, applied, tmp_path, monkeypatch, capsys):
    box = Box(tmp_path)
    for fname, text in EXTRA.items():
        (box.patches / fname).write_text(text.lstrip("\n"))
    (tmp_path / "fp8.toml").write_text(PROFILE_FP8)
    (tmp_path / "empty").mkdir()
    env = {k: v.format(box=box.patches, tmp=tmp_path) for k, v in changes.items() if k != "PACK"}
    child_env: dict[str, str | None] = {"SNDR_PATCHES": None, **env}
    for k in [k for k in os.environ if k.startswith("SNDR_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SNDR_CACHE_DIR", str(box.cache))
    monkeypatch.setenv("SNDR_RUN_DIR", str(box.run_dir))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if "PACK" in changes:
        site = tmp_path / "packsite"
        _make_pack(site)
        monkeypatch.syspath_prepend(str(site))
        child_env["PYTHONPATH"] = os.pathsep.join([str(box.root), str(REPO), str(site)])
    packs.refresh()
    try:
        root = str(box.root)
        code, listed = _cli_json(capsys, ["list", "--json", "-", "--tree", root])
        assert code == 0
        cli_enabled, cli_digest = listed["enabled"], listed["patch_set_digest"]

        dry = ["apply", "--dry-run", "--tree", root, "--json", "-", "-q"]
        if name == "patches_empty_dir":
            dry.append("--allow-empty")
        _, report = _cli_json(capsys, dry)
        assert report["patch_set_digest"] == cli_digest, name

        mode = "resolve"
        if applied:
            code, report = _cli_json(capsys, ["apply", "--tree", root, "--json", "-", "-q"])
            assert code == 0, report["problems"]
            assert box.ledger()["patch_set_digest"] == cli_digest
            code, verified = _cli_json(capsys, ["apply", "--verify", "--tree", root, "--json", "-", "-q"])
            assert code == 0 and verified["patch_set_digest"] == cli_digest, verified["problems"]
            mode = "register"

        proc = box.py(RESOLVE.replace("sys.argv[1]", repr(root)).replace("sys.argv[2]", repr(mode)), **child_env)
        hook = out_of(proc)
        assert hook["cold"] == [cli_enabled, cli_digest], (name, hook, proc.stderr)
        assert hook["warm"] == hook["cold"]
        if applied:
            enabled, digest, ledger_digest, missing, problems, hook_mode = hook["register"]
            assert (enabled, digest, ledger_digest) == (cli_enabled, cli_digest, cli_digest)
            assert hook_mode == "disk" and missing == [] and problems == [], (missing, problems)
    finally:
        packs.refresh()

    # What each scenario must resolve to, so "all readers agree" cannot pass on a set nobody loaded.
    box_all = ["F0001", "F0002", "F0003", "F0006"]
    expected = {
        "patches_set": box_all,
        "enable_off": ["F0002", "F0003", "F0006"],
        "enable_on_default_off": box_all + ["F0004"],
        "enable_runtime_off_words": ["F0001", "F0002", "F0006"],
        "plugins_off": ["F0001", "F0002", "F0003"],
        "plugins_off_one_on": box_all,
        "profile": box_all + ["F0005"],
        "pack": box_all + ["ONEHOME_0001"],
        "patches_empty_dir": [],
    }
    if name in expected:
        assert sorted(cli_enabled) == sorted(expected[name])
    else:  # unset or empty: the shipped set, whose enabled ids are all shipped patch ids
        from sndr.env import shipped_patches_dir
        from sndr.load import load_patch_set

        shipped = {p.id for p in load_patch_set(shipped_patches_dir(), packs=False).patches}
        assert cli_enabled and set(cli_enabled) <= shipped


def test_empty_sndr_patches_is_the_shipped_set_for_everyone(monkeypatch):
    """``SNDR_PATCHES=""`` and unset are the same rule in env.patches_dir, the loader and the hook."""
    from sndr import env
    from sndr.load import load_patch_set
    from sndr.startup import resolve

    for value in (None, ""):
        environ = {} if value is None else {"SNDR_PATCHES": value}
        assert env.patches_dir(environ) == env.shipped_patches_dir()
        assert resolve.patches_dir(environ) == str(env.shipped_patches_dir())
        assert load_patch_set(packs=False, environ=environ).directory == env.shipped_patches_dir()


# ----------------------------------------------------------------------------- source scans


def _sources() -> dict[str, ast.Module]:
    return {p.relative_to(REPO).as_posix(): parse(p)
            for p in sorted(PKG.rglob("*.py")) if "_data" not in p.parts}


SOURCES = _sources()

#: Reading an ``SNDR_*`` variable outside sndr/env.py, justified.
ENV_EXCEPTIONS = {
    "sndr/_boot.py": "imported by a .pth at every interpreter start; it must import nothing (not even sndr.env) "
                     "and reads only the test fault switch SNDR_TEST_FAULT",
}
#: Waiting on another engineer's file (each must still be there: a fix removes its entry).
ENV_PENDING: dict[str, str] = {}

#: ``os.replace``/``os.rename`` outside sndr/fsio.py and the transaction, justified.
REPLACE_EXCEPTIONS = {
    "sndr/commit.py": "the transaction: journal, objects and the commit's own replace protocol",
    "sndr/tree_release.py": "publishes a whole fetched tree directory and moves a wheel pip downloaded into a temp dir: "
                    "directory and whole-download renames, not file writes (fsio.atomic_write writes bytes)",
    "sndr/preflight/lineindex.py": "the line index is a sqlite database that sqlite writes itself into a temp "
                                   "from fsio.create_temp, then os.replace'd into place (fsio.atomic_write "
                                   "writes bytes it is given)",
}
REPLACE_PENDING: dict[str, str] = {}

#: Catching UnicodeDecodeError alone (a strict decode with its own error) outside sndr/fsio.py.
DECODE_PENDING = {
    "sndr/commit.py": "decode(): should be fsio.decode_strict (issue 23)",
    "sndr/load.py": "load_patch_file: should be fsio.read_text_strict (issue 23)",
}


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, ``environ``, ``env`` (a mapping parameter) or ``os.getenv``."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("environ", "getenv")
    return isinstance(node, ast.Name) and node.id in ("environ", "getenv")


def _sndr_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("SNDR_")


def sndr_env_reads(tree: ast.Module) -> list[int]:
    """Lines that read an ``SNDR_*`` name from an environment directly, or build one by hand."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and _is_environ(n.value) and _sndr_literal(n.slice):
            lines.append(n.lineno)
        elif isinstance(n, ast.Call):
            f = n.func
            target = f.value if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") else f
            if _is_environ(target) and n.args and _sndr_literal(n.args[0]):
                lines.append(n.lineno)
        elif isinstance(n, ast.Compare) and _sndr_literal(n.left) and any(_is_environ(c) for c in n.comparators):
            lines.append(n.lineno)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and _sndr_literal(n.left):
            lines.append(n.lineno)  # "SNDR_ENABLE_" + ...: a second home of the enable_var rule
    return sorted(set(lines))


def replace_calls(tree: ast.Module) -> list[int]:
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "os"
                   and n.func.attr in ("replace", "rename")})


def strict_decodes(tree: ast.Module) -> list[int]:
    """``except UnicodeDecodeError`` on its own: a strict decode that makes its own error. (In a tuple with
    OSError it is a best-effort read that gives up quietly, a different thing.)"""
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)
                   and isinstance(n.type, ast.Name) and n.type.id == "UnicodeDecodeError"})


_CACHE_DIR_CALLS = ("open_dir", "dir_path", "require_dir")


def cache_dir_literals(tree: ast.Module) -> list[int]:
    """A cache directory spelt by hand: ``caches.open_dir("x", ...)`` (``dir_path``, ``require_dir``), or
    ``cache_root() / "x"``. The layout under the cache root is named in env.py (``env.CACHE_*``)."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.args:
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            first = n.args[0]
            if name in _CACHE_DIR_CALLS and (isinstance(first, ast.Constant) or (
                    isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant))):
                lines.append(n.lineno)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and isinstance(n.right, ast.Constant) \
                and isinstance(n.left, ast.Call) and "cache_root" in ast.unparse(n.left):
            lines.append(n.lineno)
    return sorted(set(lines))


def enabled_set_builds(tree: ast.Module) -> list[int]:
    """The enabled set built by hand: ``x.digest(ids)`` (a digest of chosen patches) or a comprehension
    that keeps what a gate says is ``.enabled``. Its one home is ``plan.enabled_set``."""
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "digest" \
                and (n.args or n.keywords):
            lines.add(n.lineno)
        elif isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            if any(isinstance(x, ast.Attribute) and x.attr == "enabled"
                   for g in n.generators for cond in g.ifs for x in ast.walk(cond)):
                lines.add(n.lineno)
    return sorted(lines)


def console_builds(tree: ast.Module) -> list[int]:
    """A rich ``Console(...)`` built by hand, or the output width read by hand (``get_terminal_size``,
    ``COLUMNS``): every report's console and its width rule live in ``sndr.render.make_console``."""
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name in ("Console", "get_terminal_size"):
                lines.add(n.lineno)
        elif isinstance(n, ast.Constant) and n.value == "COLUMNS":
            lines.add(n.lineno)
    return sorted(lines)


def _check(scan, home: set[str], exceptions: dict[str, str], pending: dict[str, str], what: str) -> None:
    found = {rel: lines for rel, tree in SOURCES.items() if rel not in home and (lines := scan(tree))}
    unexplained = {rel: lines for rel, lines in found.items() if rel not in exceptions and rel not in pending}
    assert not unexplained, f"{what} outside its home {sorted(home)}: {unexplained}"
    fixed = sorted(rel for rel in pending if rel not in found)
    assert not fixed, f"{what}: {fixed} no longer need their PENDING entry; remove it"


def test_sndr_variables_are_read_only_in_env_py():
    _check(sndr_env_reads, {"sndr/env.py"}, ENV_EXCEPTIONS, ENV_PENDING, "SNDR_* environment reads")


def test_atomic_writes_live_in_fsio_and_the_transaction():
    _check(replace_calls, {"sndr/fsio.py"}, REPLACE_EXCEPTIONS, REPLACE_PENDING, "temp + os.replace writes")


def test_strict_utf8_decoding_lives_in_fsio():
    _check(strict_decodes, {"sndr/fsio.py"}, {}, DECODE_PENDING, "strict UTF-8 decodes")


def test_cache_layout_is_named_in_env_py():
    _check(cache_dir_literals, {"sndr/env.py"}, {}, {}, "cache directories spelt by hand")


def test_the_enabled_set_is_built_only_by_plan_enabled_set():
    _check(enabled_set_builds, {"sndr/plan.py"}, {}, {}, "enabled ids or their digest assembled by hand")


def test_consoles_and_their_width_are_built_only_by_render_make_console():
    _check(console_builds, {"sndr/render.py"}, {}, {}, "rich consoles or output widths built by hand")


def test_the_scanners_see_what_they_are_for():
    src = textwrap.dedent('''
        import os
        a = os.environ.get("SNDR_X")
        b = os.environ["SNDR_Y"]
        c = "SNDR_Z" in os.environ
        d = os.getenv("SNDR_W")
        e = environ.get("SNDR_V", "")
        f = "SNDR_ENABLE_" + pid
        g = f"SNDR_STRICT={raw!r} is not a boolean"   # a message, not a read
        h = os.environ.get(env.STRICT)                  # the name comes from env.py
        os.replace(tmp, path)
        try:
            data.decode()
        except UnicodeDecodeError:
            pass
        try:
            data.decode()
        except (OSError, UnicodeDecodeError):
            pass
        caches.open_dir("cubin", "cubin cache")
        caches.dir_path(env.CACHE_TREES, "tree cache")  # named in env.py
        p = Path(env.cache_root()) / "trees"
        require_dir(f"plan-{tag}", "plan cache")
    ''')
    tree = ast.parse(src)
    assert sndr_env_reads(tree) == [3, 4, 5, 6, 7, 8]
    built = ast.parse(textwrap.dedent('''
        on = [p.id for p in ordered if gates[p.id].enabled]
        digest = patch_set.digest(on)
        whole = patch_set.digest()                   # every patch, enabled or not: not an enabled set
        mac = hmac.new(key, data, "sha256").digest()
    '''))
    assert enabled_set_builds(built) == [2, 3]
    consoles = ast.parse(textwrap.dedent('''
        console = Console(file=sys.stderr)
        c = rich.console.Console()
        cols = shutil.get_terminal_size().columns
        w = os.environ.get("COLUMNS")
        console = make_console(stderr=True)
    '''))
    assert console_builds(consoles) == [2, 3, 4, 5]
    assert replace_calls(tree) == [11]
    assert strict_decodes(tree) == [14]
    assert cache_dir_literals(tree) == [20, 22, 23]
    assert sys.version_info >= (3, 11)  # requires-python: tomllib is the stdlib's
