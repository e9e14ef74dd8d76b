"""One spec parser, one "vllm/ or its parent" rule: the --verify fast path, apply and the views agree."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sndr.errors import SndrError
from sndr.tree import directory, open_tree
from sndr.treespec import Spec, parse, plain_dir, vllm_root


@pytest.mark.parametrize("spec, want", [
    ("installed", Spec("installed", "installed", "")),
    (" installed:/opt/venv/bin/python ", Spec("installed", "installed:/opt/venv/bin/python", "/opt/venv/bin/python")),
    ("vllm==0.33.0", Spec("version", "vllm==0.33.0", "0.33.0", "==")),
    ("VLLM >= 0.30", Spec("version", "VLLM >= 0.30", "0.30", ">=")),
    ("git:/src/vllm@v0.33.0", Spec("git", "git:/src/vllm@v0.33.0", "/src/vllm@v0.33.0")),
    ("/site-packages", Spec("path", "/site-packages", "/site-packages")),
    ("dist/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
     Spec("path", "dist/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
          "dist/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")),
    ("installedstuff/x", Spec("path", "installedstuff/x", "installedstuff/x")),  # a directory's name, not a form
])
def test_parse_names_each_form(spec, want):
    assert parse(spec) == want


def _tree(at: Path) -> Path:
    (at / "vllm").mkdir(parents=True)
    (at / "vllm" / "__init__.py").write_text("")
    return at


def _specs(tmp_path: Path) -> dict[str, str]:
    """Every kind of --tree a user types, laid out under tmp_path."""
    site = _tree(tmp_path / "site")
    nested = _tree(tmp_path / "vllm")  # a checkout named vllm/ that holds vllm/: itself, not its parent
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.py").write_text("")
    (tmp_path / "x.whl").mkdir()
    return {
        "dir": str(site),
        "dir_slash": f"{site}/",
        "package": str(site / "vllm"),
        "nested": str(nested),
        "no_vllm": str(tmp_path / "empty"),
        "file": str(tmp_path / "file.py"),
        "whl_dir": str(tmp_path / "x.whl"),
        "missing": str(tmp_path / "missing"),
        "git": f"git:{site}@HEAD",
        "version": "vllm==0.32.0",
        "version_range": "vllm>=0.32",
        "installed": f"installed:{tmp_path / 'no-such-python'}",
    }


def test_plain_dir_is_the_directory_rule_of_apply(tmp_path):
    """The fast path answers exactly for the plain directories apply uses, with the same path; every other
    spec (apply refuses it, or it holds no vllm/) goes to the full verifier."""
    specs = _specs(tmp_path)
    answered = set()
    for name, spec in specs.items():
        fast = plain_dir(spec)
        try:
            full = directory(spec, dry_run=False)
        except SndrError:
            assert fast is None, name
            continue
        if (full / "vllm").is_dir():
            assert fast == str(full), name
            answered.add(name)
        else:
            assert fast is None, name  # TreeRoot refuses it (not_a_tree): the full verifier names that
    assert answered == {"dir", "dir_slash", "package", "nested"}
    assert plain_dir(specs["package"]) == specs["dir"]
    assert plain_dir(specs["nested"]) == specs["nested"]


def test_directory_says_why_it_cannot_write(tmp_path):
    specs = _specs(tmp_path)

    def code(spec: str) -> str:
        with pytest.raises(SndrError) as exc:
            directory(spec, dry_run=False)
        return exc.value.problems[0].code

    assert code(specs["file"]) == "bad_tree_spec"
    assert code(specs["whl_dir"]) == "bad_tree_spec"
    assert code(specs["git"]) == "bad_tree_spec"
    assert code(specs["version"]) == "bad_tree_spec"  # the cached release is read-only: dry-run only
    assert code(specs["missing"]) == "tree_not_found"
    assert code(specs["installed"]) == "python_not_found"


def test_the_views_use_the_same_rule(tmp_path):
    """open_tree (read) and directory (write) find the same vllm/ for every directory form."""
    specs = _specs(tmp_path)
    for name in ("dir", "dir_slash", "package", "nested"):
        assert open_tree(specs[name]).root == directory(specs[name], dry_run=False).resolve(), name
    assert vllm_root(Path(specs["no_vllm"])) is None
    with pytest.raises(SndrError) as exc:
        open_tree(specs["no_vllm"])
    assert exc.value.problems[0].code == "no_vllm"


def test_treespec_is_stdlib_only():
    """The --verify fast path imports it in a warm process: nothing beyond the stdlib."""
    import ast

    src = Path(__file__).resolve().parents[1] / "sndr" / "treespec.py"
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert all(n.split(".")[0] in sys.stdlib_module_names or n == "__future__" for n in names), names
