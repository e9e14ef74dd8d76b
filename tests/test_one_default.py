"""One default for the test suite's vLLM interpreter, in one place (issue 32 MEDIUM 5).

83 ``vllm_install`` tests defaulted to ``/opt/vllm-venv/bin/python`` while 11 tests and the README used
``~/.cache/sndr/vllm-0.32.0-venv/bin/python``: a user who built the venv as the README says got 83
skips. The default now lives in ``sndr/env.py`` (``DEFAULT_TEST_VLLM_PYTHON``, read through
``vllm_test_python()``); code elsewhere may name it only in prose (docstrings, comments, the README).
"""

from __future__ import annotations

import ast
from pathlib import Path

from sndr import env
from source_scan import parse

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "sndr" / "env.py"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of ``path`` that are not docstrings (what code can use as a path)."""
    docs = set()
    strings = []
    for node in ast.walk(parse(path)):  # one walk: a file's docstrings and its string constants
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                strings.append(node)
        elif isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in strings if id(n) not in docs]


def test_the_readme_default_is_the_one_default():
    assert env.DEFAULT_TEST_VLLM_PYTHON == str(Path.home() / ".cache/sndr/vllm-0.32.0-venv/bin/python")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "`~/.cache/sndr/vllm-0.32.0-venv/bin/python`" in readme and env.TEST_VLLM_BUILD in readme
    assert env.vllm_test_python({}) == env.DEFAULT_TEST_VLLM_PYTHON
    assert env.vllm_test_python({env.TEST_VLLM_PYTHON: "/x/python"}) == "/x/python"


def test_no_other_default_and_no_copy_of_it_in_code():
    offenders = []
    for path in sorted([*REPO.glob("sndr/**/*.py"), *REPO.glob("tests/**/*.py"), *REPO.glob("benchmarks/**/*.py")]):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        if "/opt/" + "vllm-venv" in text:
            offenders.append(f"{path.relative_to(REPO)}: names the old default /opt/vllm-venv")
        # A constant holding "...vllm-0.32.0-venv..." or "SNDR_TEST_VLLM_PYTHON" has "venv" or "VLLM_PYTHON" in
        # its source (short of escapes inside those words): only those files are parsed (18 of 269, 0.2 of
        # 2.8 MB; parsing them all cost ~1.5 s of the inner loop's CPU).
        if path == HOME or ("venv" not in text and "VLLM_PYTHON" not in text):
            continue
        for line, value in _code_strings(path):
            if "vllm-0.32.0-venv" in value or value == env.TEST_VLLM_PYTHON:
                offenders.append(f"{path.relative_to(REPO)}:{line}: its own copy {value[:60]!r}")
    assert offenders == []


def test_the_no_cached_wheel_skips_name_the_command_that_satisfies_them(monkeypatch, tmp_path):
    """The 9 skips read "no cached wheel for vllm X" and gave no way to satisfy them."""
    import pytest

    import tests.test_tree as tt

    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as exc:
        tt._wheel("0.33.0")
    msg = str(exc.value)
    assert msg.startswith("no_cached_wheel: no vllm 0.33.0 wheel in ")
    assert f"pip download --no-deps --only-binary=:all: vllm==0.33.0 -d {tmp_path / 'wheels'}" in msg


def test_the_readme_names_the_fast_tier_first_and_the_suite_time_with_its_load():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    fast = readme.index('-m "not slow and not needs_wheels"')
    timing = readme.index("The full suite's time depends on")
    assert fast < timing and "load average" in readme[timing:timing + 300]
