"""The in-memory import hook, its caches and the safety of its directories (synthetic trees)."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from hook_fixtures import Box, box, make_venv, out_of, replace_file, tree_bytes  # noqa: F401 (box is a fixture)
from sndr import env
from sndr.fsio import UnsafeDirError
from sndr.startup import hookcache, resolve

SERVE = """
    import sys, traceback
    from sndr.startup import importer
    importer.install(memory=True)
    import vllm.engine as e, vllm.sub as sub
    out = {"answer": e.answer(), "sub": sub.VALUE, "loader": type(e.__spec__.loader).__name__,
           "file": e.__file__, "planner": "sndr.plan" in sys.modules, "pydantic": "pydantic" in sys.modules,
           "sub_pkg": sub.__path__ is not None}
    try:
        e.boom()
    except ValueError:
        out["tb"] = traceback.format_exc()
    import inspect
    out["src"] = inspect.getsource(e.boom)
    import json; print("OUT" + json.dumps(out))
"""



# ----------------------------------------------------------------------------- serving


def test_serves_patched_source_and_never_writes_the_tree(box):
    before = tree_bytes(box.root)
    out = out_of(box.py(SERVE))
    assert out["answer"] == 42 and out["sub"] == "patched" and out["sub_pkg"]
    assert out["loader"] == "PatchedLoader"
    assert out["file"] == str(box.root / "vllm" / "engine.py")
    # Tracebacks name the real file and show the line that ran (the patched one).
    assert f'File "{box.root / "vllm" / "engine.py"}", line 29, in boom' in out["tb"]
    assert 'raise ValueError("patched boom")' in out["tb"]
    assert 'raise ValueError("patched boom")' in out["src"]
    assert tree_bytes(box.root) == before
    assert not (box.root / ".sndr").exists()
    assert not list(box.root.rglob("__pycache__/engine*.pyc")), "the pristine pyc path must never be written"


def test_warm_start_uses_the_cache_without_the_planner(box):
    cold = out_of(box.py(SERVE))
    assert cold["planner"] is True  # the first start plans
    warm = out_of(box.py(SERVE))
    assert warm["answer"] == 42
    assert warm["planner"] is False and warm["pydantic"] is False
    code = list((box.cache / "hook" / "code").iterdir())
    assert len(code) == 2  # engine.py and sub/__init__.py


def test_tampered_cache_entries_are_recompiled_never_trusted(box):
    box.py(SERVE)
    code_dir = box.cache / "hook" / "code"
    for entry in code_dir.iterdir():
        data = bytearray(entry.read_bytes())
        data[-5] ^= 0xFF  # damage the marshalled payload
        entry.write_bytes(bytes(data))
    # A valid entry of another key copied over this one is refused too (the key is inside).
    entries = sorted(code_dir.iterdir())
    entries[0].write_bytes(entries[1].read_bytes())
    for src in (box.cache / "hook" / "src").iterdir():
        src.write_bytes(src.read_bytes().replace(b"return 42", b"return 666"))  # sealed: MAC prefix + text
    out = out_of(box.py(SERVE))
    assert out["answer"] == 42


def test_cache_key_covers_source_digest_python_and_filename():
    k = hookcache.HookCache.code_key("a" * 64, "d1", "/t/vllm/x.py")
    assert k != hookcache.HookCache.code_key("b" * 64, "d1", "/t/vllm/x.py")
    assert k != hookcache.HookCache.code_key("a" * 64, "d2", "/t/vllm/x.py")
    assert k != hookcache.HookCache.code_key("a" * 64, "d1", "/u/vllm/x.py")
    assert sys.implementation.cache_tag in hookcache.py_tag()


def test_code_cache_roundtrip_and_checks(tmp_path):
    cache = hookcache.HookCache(str(tmp_path / "c"))
    code = compile("x = 1\n", "/t/x.py", "exec")
    key = hookcache.HookCache.code_key("0" * 64, "d", "/t/x.py")
    cache.store_code(key, code)
    assert cache.load_code(key) == code
    other = hookcache.HookCache.code_key("1" * 64, "d", "/t/x.py")
    os.link(os.path.join(cache.code_dir, key), os.path.join(cache.code_dir, other))
    assert cache.load_code(other) is None  # an entry must carry its own key
    sha = cache.store_source("y = 2\n")
    assert cache.load_source(sha) == "y = 2\n"
    assert cache.load_source("f" * 64) is None
    cache.store_memo("m-1", {"a": 1})
    assert cache.load_memo("m-1")["a"] == 1
    os.replace(os.path.join(cache.memo_dir, "m-1.json"), os.path.join(cache.memo_dir, "m-2.json"))
    assert cache.load_memo("m-2") is None
    assert stat.S_IMODE(os.stat(cache.code_dir).st_mode) == 0o700


def test_pristine_change_invalidates_the_memory_plan(box):
    assert out_of(box.py(SERVE))["answer"] == 42
    text = (box.root / "vllm" / "engine.py").read_text()
    replace_file(box.root / "vllm" / "engine.py", text.replace("return n + 1", "return n + 2"))
    proc = box.py(SERVE + "    print('STEP', e.Engine().step(1))\n")
    assert "STEP 3" in proc.stdout and out_of(proc)["answer"] == 42


def test_plan_failure_serves_nothing(box):
    text = (box.root / "vllm" / "engine.py").read_text()
    replace_file(box.root / "vllm" / "engine.py", text.replace("return 41", "return 40"))
    proc = box.py(SERVE)
    out = out_of(proc)
    assert out["sub"] == "pristine"  # check everything, then touch anything: F0002 is not served either
    assert "does not apply" in proc.stderr and "UNPATCHED" in proc.stderr


def test_compile_error_serves_nothing(tmp_path):
    box = Box(tmp_path)
    p = box.patches / "F0001-answer.toml"
    p.write_text(p.read_text().replace("    return 42\n", "    return (42\n"))
    proc = box.py(SERVE)
    assert out_of(proc)["answer"] == 41
    assert "does not compile" in proc.stderr


def test_already_imported_target_is_reported_loudly(box):
    proc = box.py("""
        import vllm.engine
        from sndr.startup import importer
        f = importer.install(memory=True)
        import vllm.engine as e
        print("ANSWER", e.answer(), f.text_state()["preimported"])
    """)
    assert "ANSWER 41 ['vllm.engine']" in proc.stdout
    assert "imported before the hook" in proc.stderr and "PRISTINE" in proc.stderr


def test_tree_with_a_ledger_leaves_the_hook_inert(box):
    box.apply()
    proc = box.py("""
        from sndr.startup import importer
        f = importer.install(memory=True)
        import vllm.engine as e
        print("STATE", e.answer(), type(e.__spec__.loader).__name__, f.inert_reason)
    """)
    assert "STATE 42 SourceFileLoader the tree is patched on disk" in proc.stdout


def test_disabled_by_env(box):
    proc = box.py(SERVE, SNDR_HOOK="0")
    assert out_of(proc)["answer"] == 41


@pytest.mark.parametrize("value,active", [("Off", False), (" no ", False), ("", False), ("yes", True), ("1", True)])
def test_sndr_hook_takes_every_boolean_word(value, active):
    """SNDR_HOOK reads the words every boolean SNDR_* variable takes (env._flag), not a list of its own."""
    assert env.hook_enabled({env.HOOK: value}) is active


def test_a_sndr_hook_typo_keeps_the_hook_active_and_says_so(box):
    proc = box.py(SERVE, SNDR_HOOK="of")
    assert out_of(proc)["answer"] == 42
    assert "SNDR_HOOK='of' is not a boolean" in proc.stderr and "stays active" in proc.stderr


def test_unsafe_cache_is_refused_loudly_and_serving_still_works(box):
    box.cache.mkdir()
    (box.cache / "hook").mkdir(mode=0o777)
    os.chmod(box.cache / "hook", 0o777)
    proc = box.py(SERVE)
    assert out_of(proc)["answer"] == 42  # compiled in memory, nothing cached
    assert "writable by group or others" in proc.stderr and "code cache is disabled" in proc.stderr
    assert not (box.cache / "hook" / "code").exists()


# ----------------------------------------------------------------------------- safe directories


def test_secure_dir_creates_0700(tmp_path):
    d = hookcache.secure_dir(str(tmp_path / "a" / "b"))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_secure_dir_refuses_group_writable(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    os.chmod(d, 0o775)
    with pytest.raises(UnsafeDirError, match="writable by group or others"):
        hookcache.secure_dir(str(d))


def test_secure_dir_refuses_symlink(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeDirError, match="symlink"):
        hookcache.secure_dir(str(tmp_path / "link"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_secure_dir_refuses_another_owner(tmp_path):
    d = tmp_path / "o"
    d.mkdir(mode=0o700)
    os.chown(d, 4242, -1)
    with pytest.raises(UnsafeDirError, match="owned by uid 4242"):
        hookcache.secure_dir(str(d))


def test_secure_dir_refuses_world_writable_parent_without_sticky_bit(tmp_path):
    parent = tmp_path / "p"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(UnsafeDirError, match="sticky"):
        hookcache.secure_dir(str(parent / "c"))
    os.chmod(parent, 0o1777)
    hookcache.secure_dir(str(parent / "d"))


def test_shipped_patches_dir_agrees_with_the_loader():
    from sndr.load import shipped_patches_dir

    assert resolve.shipped_patches_dir() == str(shipped_patches_dir())


def test_editing_the_cli_shell_keeps_the_memo_and_editing_the_planner_drops_it(box, tmp_path, monkeypatch):
    """The memo's fingerprint stamps the code that decides a resolution (the planner, the loader, ...),
    not the CLI shell: a new --help text in apply.py keeps every process warm; a planner edit does not."""
    import shutil
    from pathlib import Path

    root = Path(resolve.package_root())
    copy = tmp_path / "sndr"
    for name in set(resolve.STAMP_MODULES) | {"apply.py", "__main__.py", "cli.py"}:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, copy / name)
    monkeypatch.setattr(resolve, "package_root", lambda: str(copy))
    env = {"SNDR_CACHE_DIR": str(tmp_path / "cache")}
    tid = resolve.tree_identity(str(box.root))

    def fingerprint() -> str:
        return resolve.set_fingerprint(str(box.patches), tid, env, None, profile=False)

    before = fingerprint()
    for name in ("apply.py", "__main__.py", "cli.py"):
        text = (copy / name).read_text()
        (copy / name).write_text(text.replace('"""', '"""An edited help text. ', 1))
        os.utime(copy / name, ns=(1, 1))  # another size and mtime: whatever the stamp read, it changed
    assert fingerprint() == before
    (copy / "plan.py").write_text((copy / "plan.py").read_text() + "\n# a planner edit\n")
    assert fingerprint() != before


def test_every_module_the_cold_memory_plan_runs_is_on_the_code_stamp(box):
    """The in-memory plan (the read-only image's path) reads the tree's version and decodes its files through
    the tree views and commit.decode: a change to any module it runs must invalidate the memo, so each one it
    loads is on the code stamp (errors and stderr hold messages only)."""
    out = out_of(box.py("""
        import json, os, sys
        from sndr.startup import resolve
        resolve.memory_plan(os.environ["TREE_ROOT"])
        print("OUT" + json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("sndr."))}))
    """, TREE_ROOT=str(box.root)))["modules"]
    assert "sndr.plan" in out and "sndr.apply" not in out
    stamped = {n[:-3].replace("/", ".") for n in resolve.STAMP_MODULES}
    assert {m[len("sndr."):] for m in out} - stamped <= {"startup", "errors", "stderr"}, out


def test_the_startup_resolution_never_imports_the_cli_shell(box):
    """resolve_set (the cold path: pydantic and the planner) imports the core below the CLI, and every sndr
    module it runs is on the code stamp (errors.py holds messages and exit codes, stderr.py the warning line: neither decides what resolves)."""
    out = out_of(box.py("""
        import json, os, sys
        from sndr.startup import resolve
        resolve.resolve_set("0.32.0", resolve.tree_identity(os.environ["TREE_ROOT"]))
        print("OUT" + json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("sndr."))}))
    """, TREE_ROOT=str(box.root)))["modules"]
    assert "sndr.apply" not in out and "sndr.plan" in out
    stamped = {n[:-3].replace("/", ".") for n in resolve.STAMP_MODULES}
    assert {m[len("sndr."):] for m in out} - stamped <= {"startup", "errors", "stderr"}, out


# ----------------------------------------------------------------------------- .pth, spawn, boot failure


@pytest.fixture
def venv_box(tmp_path):
    box = Box(tmp_path)
    python, site = make_venv(tmp_path)
    (site / "01-fake-tree.pth").write_text(str(box.root) + "\n")
    from sndr.__main__ import main as sndr_main

    assert sndr_main(["hook", "install", "--site", str(site)]) == 0
    return box, python, site


SPAWN = """
    import multiprocessing as mp, json, sys

    def child(q):
        import vllm.engine as e
        q.put({"answer": e.answer(), "loader": type(e.__spec__.loader).__name__,
               "finder": any(type(f).__name__ == "SndrFinder" for f in sys.meta_path)})

    if __name__ == "__main__":
        out = {}
        for method in ("spawn", "fork"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start(); out[method] = q.get(timeout=120); p.join()
        print("OUT" + json.dumps(out))
"""


def test_pth_installs_the_hook_in_spawned_and_forked_children(venv_box):
    box, python, site = venv_box
    script = box.tmp / "spawn_check.py"
    import textwrap

    script.write_text(textwrap.dedent(SPAWN))
    import subprocess

    env = box.environ(PYTHONPATH=None)
    proc = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, cwd=str(box.tmp), timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = out_of(proc)
    for method in ("spawn", "fork"):
        assert out[method] == {"answer": 42, "loader": "PatchedLoader", "finder": True}, (method, proc.stderr)
    assert (site / "_sndr_hook.pth").read_text().splitlines()[-1] == "import sndr._boot"


def test_boot_failure_never_breaks_interpreter_start(venv_box):
    box, python, site = venv_box
    import subprocess

    env = box.environ(PYTHONPATH=None, SNDR_TEST_FAULT="boot")
    code = "import vllm.engine as e; print('ANSWER', e.answer())"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=str(box.tmp))
    assert proc.returncode == 0
    assert "ANSWER 41" in proc.stdout
    assert proc.stderr.count("in-memory import hook failed to start") == 1
    # Under SNDR_STRICT=1 the failure surfaces in register(), with the boot message.
    code = "import sndr.startup.hook as h\ntry:\n    h.register()\nexcept Exception as exc:\n    print('RAISED', exc)\n"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=dict(env, SNDR_STRICT="1"),
                          cwd=str(box.tmp))
    assert "RAISED" in proc.stdout and "injected boot failure" in proc.stdout and "SNDR_STRICT=1" in proc.stdout


def test_created_modules_and_package_resources_are_served(box):
    (box.patches / "F0004-create.toml").write_text(
        'id = "F0004"\ntitle = "A new module"\n\n[[files]]\npath = "vllm/sub/extra.py"\n'
        "create = '''\nWHO = \"created by sndr\"\n'''\n")
    (box.root / "vllm" / "sub" / "data.txt").write_text("resource\n")
    proc = box.py("""
        from sndr.startup import importer
        importer.install(memory=True)
        import importlib.resources, vllm.sub.extra as x
        print("OUT", x.WHO, importlib.resources.files("vllm.sub").joinpath("data.txt").read_text().strip())
    """)
    assert "OUT created by sndr resource" in proc.stdout
    assert not (box.root / "vllm" / "sub" / "extra.py").exists()


def test_memo_key_ignores_the_process_argv_unless_a_patch_has_when(box, tmp_path):
    """Spawned vLLM workers have argv naming fresh pipe fds: a set without `when` must still hit the warm memo."""
    from sndr import profile as profmod

    env = {"SNDR_CACHE_DIR": str(tmp_path / "cache")}
    cache = hookcache.open_cache(env)
    tid = resolve.tree_identity(str(box.root)) + "\0" + "0.32.0"
    pdir = str(box.patches)

    def resolve_as(argv):
        profmod.use_process_profile(profmod.process_profile(env, argv=argv))
        try:
            resolved = resolve.resolve_set("0.32.0", resolve.tree_identity(str(box.root)), env, cache, pdir)
            return resolve.memo_key("set-", pdir, tid, env, cache)[0], resolved
        finally:
            profmod.use_process_profile(None)

    k1, r1 = resolve_as(["-c", "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=11)"])
    k2, r2 = resolve_as(["-c", "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=17)"])
    assert not r1["needs_profile"] and k1 == k2 and r1["digest"] == r2["digest"]
    assert cache.load_memo(k1)["digest"] == r1["digest"]  # stored where the next process looks

    # A set with a `when` table: the profile decides it, so the key follows the process's argv.
    when = box.patches / "F0009-when.toml"
    when.write_text('id = "F0009"\ntitle = "when"\nkind = "text"\nwhen = { quantization = "fp8" }\n'
                    '[[files]]\npath = "vllm/engine.py"\n[[files.edits]]\nname = "w"\n'
                    'anchor = "def answer():\\n"\nreplacement = "def answer():  # w\\n"\n')
    k3, r3 = resolve_as(["vllm", "serve", "m", "--quantization", "fp8"])
    k4, _ = resolve_as(["vllm", "serve", "m"])
    assert r3["needs_profile"] and k3 != k4 and k3.startswith("set-p-")
