"""``VLLM_PLUGINS`` and sndr's plugin: vLLM's rule, mirrored exactly, and the process vLLM does not call sndr in.

The real vLLM 0.32.0 processes are in ``tests/e2e/test_vllm_plugins.py``; here a synthetic tree whose
``vllm/plugins`` filters its general plugins as vLLM 0.32.0 does (``name in VLLM_PLUGINS.split(",")``).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from hook_fixtures import REPO, box, out_of  # noqa: F401 (box is a fixture)
from sndr import env
from sndr.errors import CODES
from sndr.startup import plugincheck
from sndr.startup.status import read_status

#: vLLM 0.32.0's general-plugin loading, reduced to its filter: the environment read as vllm/envs.py reads it,
#: the names compared as load_plugins_by_group compares them, and the once-per-process flag.
PLUGINS = '''\
import os

plugins_loaded = False
DISCOVERED = {"other": lambda: None, "sndr": lambda: __import__("sndr.startup.hook").startup.hook.register()}


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    allowed = None if "VLLM_PLUGINS" not in os.environ else os.environ["VLLM_PLUGINS"].split(",")
    for name, func in DISCOVERED.items():
        if allowed is None or name in allowed:
            func()
'''

#: A process with sndr's import hook (the .pth's boot), loading its plugins twice as vLLM's processes do.
PROCESS = """
    import json, os
    import sndr._boot  # what the .pth of `sndr hook install` runs at interpreter start
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    load_general_plugins()
    from vllm.engine import Engine
    import sndr.startup.hook as h
    st = h._STATE
    print("OUT" + json.dumps({"pid": os.getpid(), "mark": getattr(Engine.step, "__sndr_patch__", None),
                              "missing": st.missing if st else None, "problems": st.problems if st else None}))
"""


def _plugins(box) -> None:
    (box.root / "vllm" / "plugins").mkdir()
    (box.root / "vllm" / "plugins" / "__init__.py").write_text(PLUGINS)


VALUES = [None, "", ",", " ", "sndr", "other,sndr", ",sndr,", "other, sndr", "sndr ", "SNDR", "other", "other;sndr"]


@pytest.mark.parametrize("value", VALUES)
def test_exclusion_is_vllms_own_rule(value):
    environ = {} if value is None else {env.VLLM_PLUGINS: value}
    why = env.vllm_plugins_exclusion(environ)
    vllm_loads_sndr = value is None or env.PLUGIN_NAME in value.split(",")  # vllm/plugins/__init__.py, 0.32.0
    assert (why is None) == vllm_loads_sndr
    if why is not None:
        assert why.startswith(f"VLLM_PLUGINS={value!r} does not name 'sndr'")
        line = plugincheck.finding(environ)
        assert line is not None and line.endswith("(vllm_plugins_excludes_sndr)") and "\n" not in line


def test_the_messages_say_why():
    why = lambda v: env.vllm_plugins_exclusion({env.VLLM_PLUGINS: v})  # noqa: E731
    assert why("").endswith("it names no plugin, so vLLM loads no general plugin")
    assert why(",").endswith("it names no plugin, so vLLM loads no general plugin")
    assert "' sndr' is not 'sndr'" in why("other, sndr") and "no strip, no case folding" in why("other, sndr")
    assert "'SNDR' is not 'sndr'" in why("SNDR")
    assert why("other,lora").endswith("vLLM loads only 'other', 'lora'")
    assert "fix: set VLLM_PLUGINS=other,lora,sndr (no spaces) or unset it" in plugincheck.finding(
        {env.VLLM_PLUGINS: "other, lora, SNDR"})
    assert "fix: set VLLM_PLUGINS=sndr (no spaces)" in plugincheck.finding({env.VLLM_PLUGINS: ""})
    assert plugincheck.not_called().endswith("(plugin_not_called)")
    assert {"vllm_plugins_excludes_sndr", "plugin_not_called"} <= set(CODES)


def test_one_rule_for_the_near_misses_the_finding_names_and_the_fix_drops():
    """env.names_sndr_loosely is the only fold: every entry the finding calls a near miss is one the fix leaves out,
    and no other entry is left out."""
    assert [n for n in ("sndr", " sndr", "SNDR ", "Sndr", "sndr2", "s ndr", "") if env.names_sndr_loosely(n)] == [
        "sndr", " sndr", "SNDR ", "Sndr"]
    for value in ("a, SNDR ,b", " Sndr", "x,sndr ,y, SNDR"):
        near = [n for n in value.split(",") if env.names_sndr_loosely(n)]
        why = env.vllm_plugins_exclusion({env.VLLM_PLUGINS: value})
        assert all(repr(n) in why for n in near), (value, why)
        fixed = plugincheck.fix({env.VLLM_PLUGINS: value}).split()[1].split("=", 1)[1].split(",")
        assert fixed[-1] == env.PLUGIN_NAME and fixed.count(env.PLUGIN_NAME) == 1
        assert fixed[:-1] == [n.strip() for n in value.split(",") if n.strip() and not env.names_sndr_loosely(n)]


def test_the_rule_is_the_one_the_pinned_vllm_runs(vllm_pin_root: Path):
    """sndr mirrors vLLM's parsing; if the pin's parsing changes, this says so."""
    envs = (vllm_pin_root / "vllm" / "envs.py").read_text()
    assert re.search(r'"VLLM_PLUGINS": lambda: \(\s*None\s*if "VLLM_PLUGINS" not in os\.environ\s*'
                     r'else os\.environ\["VLLM_PLUGINS"\]\.split\(","\)\s*\)', envs)
    plugins = (vllm_pin_root / "vllm" / "plugins" / "__init__.py").read_text()
    assert 'DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"' in plugins
    assert "if allowed_plugins is None or plugin.name in allowed_plugins:" in plugins


def test_the_plugin_name_is_the_entry_point_sndr_installs():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {env.PLUGIN_NAME: "sndr.startup.hook:register"}


def test_a_process_vllm_plugins_leaves_sndr_out_of_attests_and_names_what_is_not_active(box):
    _plugins(box)
    proc = box.py(PROCESS, VLLM_PLUGINS="other")
    out = out_of(proc)
    assert out["mark"] is None  # the runtime patch is not installed: only register() installs it
    assert out["missing"] == ["F0003: runtime patch not active: vLLM did not call sndr's plugin"]
    assert out["problems"][0].startswith("VLLM_PLUGINS='other' does not name 'sndr': vLLM loads only 'other'")
    # said once, with the patch, the variable, its value and the fix (the second load_general_plugins adds nothing)
    assert proc.stderr.count("VLLM_PLUGINS='other' does not name 'sndr'") == 1, proc.stderr
    assert "F0003: runtime patch not active" in proc.stderr and "set VLLM_PLUGINS=other,sndr" in proc.stderr
    (rec,) = box.records()
    assert rec["pid"] == out["pid"] and rec["mode"] == "memory" and rec["missing_required"] == out["missing"]
    st = read_status(str(box.run_dir), environ={})
    assert not st.ok
    assert any(f.startswith(f"pid {rec['pid']} (") and "(vllm_plugins_excludes_sndr)" in f for f in st.findings)
    assert any("missing F0003: runtime patch not active" in f for f in st.findings)


def test_a_list_naming_sndr_changes_nothing(box):
    _plugins(box)
    out = out_of(box.py(PROCESS, VLLM_PLUGINS="other,sndr"))
    assert out["mark"] == "F0003/count" and out["missing"] == [] and out["problems"] == []
    assert read_status(str(box.run_dir), environ={}).ok


def test_strict_stops_the_process(box):
    _plugins(box)
    proc = box.py(PROCESS, check=False, VLLM_PLUGINS="", SNDR_STRICT="1")
    assert proc.returncode != 0 and "StrictError" in proc.stderr and "refusing to start vLLM" in proc.stderr
    assert "VLLM_PLUGINS='' does not name 'sndr'" in proc.stderr and "F0003" in proc.stderr


def test_without_the_entry_point_it_is_plugin_not_called(box):
    _plugins(box)
    no_sndr = PLUGINS.replace('lambda: None, "sndr"', 'lambda: None}  # "sndr"')  # sndr only on sys.path
    (box.root / "vllm" / "plugins" / "__init__.py").write_text(no_sndr)
    out = out_of(box.py(PROCESS))
    assert out["problems"][0].endswith("(plugin_not_called)") and out["missing"] and out["mark"] is None


def test_a_later_register_replaces_the_record(box):
    _plugins(box)
    code = PROCESS + """
    h.register()
    print("OUT" + json.dumps({"missing": h._STATE.missing, "problems": h._STATE.problems,
                              "mark": getattr(Engine.step, "__sndr_patch__", None)}))
    """
    out = out_of(box.py(code, VLLM_PLUGINS="other"))
    assert out == {"missing": [], "problems": [], "mark": "F0003/count"}
    (rec,) = box.records()  # one record per process, the registered one
    assert rec["missing_required"] == [] and rec["problems"] == []


def test_status_checks_the_environment_it_runs_in(tmp_path):
    st = read_status(str(tmp_path / "run"), environ={env.VLLM_PLUGINS: "other, sndr"})
    assert any(f.startswith("in the environment sndr status runs in: VLLM_PLUGINS='other, sndr'") for f in st.findings)
    st = read_status(str(tmp_path / "run"), environ={env.VLLM_PLUGINS: "sndr"})
    assert not any("VLLM_PLUGINS=" in f for f in st.findings)
    assert any("no attestation records" in f and "VLLM_PLUGINS" in f for f in st.findings)
    assert json.dumps(st.findings)  # plain strings, as --json writes them
