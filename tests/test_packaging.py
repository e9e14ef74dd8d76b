"""The wheel ships patches/ and anchors/, and sndr finds them from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"wheel build failed:\n{r.stdout}\n{r.stderr}")
    (whl,) = out.glob("sndr-*.whl")
    return whl


def test_wheel_contains_patch_set_and_manifests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(p.name for p in (ROOT / "patches").iterdir() if p.is_file())
    assert shipped, "patches/ is empty"
    for name in shipped:
        assert f"sndr/_data/patches/{name}" in names
    for p in (ROOT / "anchors").glob("*.json"):
        assert f"sndr/_data/anchors/{p.name}" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    # the CUDA decode source is compiled at run time from the installed package
    assert "sndr/kernels/turboquant_k8v4/decode_k8v4.cu" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[vllm.general_plugins]" in entry_points and "sndr.startup.hook:register" in entry_points


def test_installed_wheel_finds_shipped_set_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    code = ("import sndr.load as l, json; ps = l.load_patch_set(); "
            "print(json.dumps([str(l.shipped_patches_dir()), len(ps.patches)]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json

    where, n = json.loads(r.stdout)
    assert where.startswith(str(target)) and where.endswith("sndr/_data/patches")
    n_shipped = len([p for p in (ROOT / "patches").glob("*.toml") if not p.name.startswith("_")])
    assert n == n_shipped > 0


#: The triton each torch's CUDA build requires (its wheel METADATA on PyPI, Requires-Dist), for the torch
#: vLLM pins: 0.32.0 -> torch 2.13.0, 0.33.0 -> torch 2.14.0.
TORCH_TRITON = {"2.13.0": "3.7.1", "2.14.0": "3.8.0"}


def test_ci_runs_the_kernel_tests_on_the_triton_of_vllms_torch_inside_the_declared_range():
    import re
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["kernels"]
    (spec,) = [Requirement(r).specifier for r in extra if Requirement(r).name == "triton"]
    readme = (ROOT / "README.md").read_text()
    cmd = re.search(r"^```bash\n.*\n(.*)\n```", readme, re.M).group(1)  # the line .ci/run executes
    torch_pin = re.search(r"'torch==([\d.]+)'", cmd).group(1)
    triton_pin = re.search(r"'triton==([\d.]+)'", cmd).group(1)
    assert triton_pin == TORCH_TRITON[torch_pin], (torch_pin, triton_pin)
    for version in TORCH_TRITON.values():  # both pins' tritons are inside the tested range
        assert spec.contains(version), (spec, version)
    assert not spec.contains("3.9.0")  # 31 GDN interpreter tests fail there (see pyproject.toml)
