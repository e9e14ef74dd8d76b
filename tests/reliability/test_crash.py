"""Crash consistency: SIGKILL sndr.apply at every step of a commit, then recover.

The fault points are named in sndr/commit.py (``_fault``) and reached only when
the test-only variable SNDR_TEST_FAULT names them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sndr.apply import run_apply, run_revert
from sndr.load import load_patch_set

from .conftest import RELIABILITY_FILES

N = len(RELIABILITY_FILES)
POINTS = (["after_lock", "after_journal"]
          + [f"after_tmp:{i}" for i in range(N)]
          + [f"after_replace:{i}" for i in range(N)]
          + ["before_ledger", "after_ledger", "after_commit"])
NEXT = ["apply", "verify", "revert"]
RESULTS: dict[str, list] = {"tried": [], "recovered": []}


def sndr(tree, patches, mode: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SNDR_TEST_FAULT", None)
    if fault:
        env["SNDR_TEST_FAULT"] = fault
    args = [sys.executable, "-m", "sndr.apply", "--tree", str(tree), "--patches", str(patches), "-q"]
    if mode != "apply":
        args.append(f"--{mode}")
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("op", ["apply", "revert"])
@pytest.mark.parametrize("point", POINTS)
def test_kill_at_every_commit_step(scenario, op, point):
    tree = scenario.fresh()
    patch_set = load_patch_set(scenario.patches, packs=False)
    if op == "revert":
        assert run_apply(tree, patch_set).ok
        assert scenario.state(tree) == "patched"
    killed = sndr(tree, scenario.patches, op, fault=point)
    assert killed.returncode == -signal.SIGKILL, f"fault point {point} was never reached: {killed.stderr}"
    RESULTS["tried"].append((op, point))
    follow = NEXT[(POINTS.index(point) + (op == "revert")) % 3]
    after = sndr(tree, scenario.patches, follow)
    state = scenario.state(tree)
    assert state in ("pristine", "patched"), f"{op} killed at {point}, then {follow}: tree is {state}"
    assert after.returncode in (0, 1), after.stderr
    if follow == "apply":
        assert after.returncode == 0 and state == "patched", after.stdout + after.stderr
    elif follow == "revert":
        assert after.returncode == 0 and state == "pristine", after.stdout + after.stderr
    else:  # verify agrees with what is on disk
        assert (after.returncode == 0) == (state == "patched"), after.stdout
    assert not (tree / ".sndr" / "journal.json").exists()
    # And the tree keeps working: a final apply + revert round trip is exact.
    assert run_apply(tree, patch_set).ok and scenario.state(tree) == "patched"
    assert run_revert(tree).ok and scenario.state(tree) == "pristine"
    RESULTS["recovered"].append((op, point))


def test_kill_point_count_is_reported():
    """Runs last in this module: every kill point tried was recovered. In one process every
    (op, point) pair was tried; under pytest-xdist each worker sees only the pairs it was given,
    so there the check is that each of those was recovered (the pairs are named)."""
    tried, recovered = RESULTS["tried"], RESULTS["recovered"]
    print(f"\ncrash consistency: {len(tried)} kill points tried, {len(recovered)} recovered "
          f"({N} files, ops apply+revert): {sorted(recovered)}")
    assert sorted(recovered) == sorted(tried), sorted(set(tried) - set(recovered))
    if tried and not os.environ.get("PYTEST_XDIST_WORKER"):
        assert len(tried) == 2 * len(POINTS)
