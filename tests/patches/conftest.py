"""Harness for the behaviour tests of the shipped patch set.

The shipped set is applied (``sndr.apply.run_apply``, the real commit path)
to a private copy of the cached vLLM 0.32.0 source tree, once per session.
Each test module then runs one child process with the real CPU install of
vLLM 0.32.0 (``$SNDR_TEST_VLLM_PYTHON``, default ``~/.cache/sndr/vllm-0.32.0-venv/bin/python``: the
``vllm_py`` fixture of ``tests/conftest.py``;
torch 2.13 CPU, native kernels absent) with ``PYTHONPATH=<patched copy>:<repo>``,
so ``import vllm`` imports the patched source and torch comes from the
install. The child runs a batch of named cases and prints their results as
one JSON line; the test functions assert on them. One child per module keeps
the cost of importing vLLM (10-20 s) to a handful of imports per run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULT_TAG = "SNDR_RESULT "

#: Prepended to every child script: ``@case("name")`` runs the function at
#: once and records its return value or the exception it raised.
PREAMBLE = r'''
import json, sys, traceback
RESULTS = {}

def case(name):
    def run(fn):
        try:
            RESULTS[name] = {"ok": True, "value": fn()}
        except BaseException as exc:  # noqa: BLE001 - recorded, asserted by the test
            RESULTS[name] = {"ok": False, "type": type(exc).__name__, "message": str(exc)[:4000],
                             "traceback": traceback.format_exc()[-4000:]}
        return fn
    return run
'''

EPILOGUE = r'''
print("SNDR_RESULT " + json.dumps(RESULTS, default=repr))
'''


@pytest.fixture(scope="session")
def patched_pin_root(tmp_path_factory, vllm_pin_root) -> Path:
    """A private copy of vLLM 0.32.0 with the whole shipped set applied on disk."""
    from sndr.apply import run_apply
    from sndr.load import load_patch_set

    root = tmp_path_factory.mktemp("patched") / "site"
    shutil.copytree(vllm_pin_root, root, ignore=shutil.ignore_patterns(".complete"))
    report = run_apply(root, load_patch_set(packs=False), environ={})
    assert report.ok, [p.model_dump() for p in report.problems]
    return root


def run_cases(python: str, script: str, root: Path | None = None, timeout: float = 900) -> dict:
    """Run ``script`` (using ``@case``) in the vLLM install; return ``{case: result}``.

    ``root`` (a tree containing ``vllm/``) shadows the installed vLLM; without
    it the child imports the install itself.
    """
    return run_child(python, PREAMBLE + script + EPILOGUE, root, timeout)


def run_child(python: str, code: str, root: Path | None = None, timeout: float = 900) -> dict:
    """Run ``code`` in the vLLM install (sndr from this checkout, no SNDR_* or PYTHON* variables of
    ours, ``root`` shadowing the installed vLLM if given); return the JSON of its last
    ``SNDR_RESULT`` line. Fails with the child's output when it exits non-zero or prints none."""
    path = [str(root)] if root is not None else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SNDR_", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=os.pathsep.join(path + [str(REPO)]), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "INFO"))
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd="/", env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child failed (rc {proc.returncode}):\nSTDOUT:\n{proc.stdout[-4000:]}\n"
                             f"STDERR:\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def ok(results: dict, name: str):
    """The value a case returned; fails the test with the child's traceback otherwise."""
    r = results[name]
    assert r["ok"], f"case {name!r} raised {r['type']}: {r['message']}\n{r['traceback']}"
    return r["value"]


def raised(results: dict, name: str, exc_type: str, *fragments: str) -> str:
    """Assert that a case raised ``exc_type`` with every fragment in its message; return the message."""
    r = results[name]
    assert not r["ok"], f"case {name!r} did not raise; it returned {r['value']!r}"
    assert r["type"] == exc_type, f"case {name!r} raised {r['type']}, not {exc_type}: {r['message']}\n{r['traceback']}"
    for f in fragments:
        assert f in r["message"], f"case {name!r}: {f!r} not in message {r['message']!r}"
    return r["message"]
