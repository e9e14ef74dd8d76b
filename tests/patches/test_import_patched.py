"""vLLM 0.32.0 still imports with the whole shipped set applied on disk.

Every module the set changes is imported by the CPU install of vLLM 0.32.0
from the patched copy (``import vllm`` first, as a server would).
"""

from __future__ import annotations

import pytest

from sndr.load import load_patch_set

from .conftest import ok, run_cases

pytestmark = pytest.mark.vllm_install


def patched_modules() -> list[str]:
    ps = load_patch_set(packs=False)
    files = sorted({f.path for p in ps.patches if p.default and p.lifecycle != "retired" for f in p.files})
    return [f[: -len(".py")].replace("/", ".").removesuffix(".__init__") for f in files if f.endswith(".py")]


SCRIPT = r'''
import importlib
import vllm

@case("vllm_file")
def _():
    return vllm.__file__

@case("version")
def _():
    return vllm.__version__

for _name in MODULES:
    @case(_name)
    def _(name=_name):
        mod = importlib.import_module(name)
        return mod.__file__
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, f"MODULES = {patched_modules()!r}\n" + SCRIPT, patched_pin_root)


def test_vllm_comes_from_the_patched_copy(results, patched_pin_root):
    assert ok(results, "vllm_file").startswith(str(patched_pin_root))
    assert ok(results, "version") == "0.32.0"


@pytest.mark.parametrize("module", patched_modules())
def test_patched_module_imports(results, patched_pin_root, module):
    path = ok(results, module)
    assert path.startswith(str(patched_pin_root))
    assert "sndr guard" in open(path).read() or module_has_backport(module)


def module_has_backport(module: str) -> bool:
    ps = load_patch_set(packs=False)
    rel = module.replace(".", "/") + ".py"
    return any(f.path == rel for p in ps.patches if p.id.startswith("PN") for f in p.files)
