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
