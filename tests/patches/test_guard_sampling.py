"""PG0006: a seed outside int64 is a per-request validation error, not an engine-core crash."""

from __future__ import annotations

import pytest

from .conftest import ok, raised, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
import numpy as np
from vllm.sampling_params import SamplingParams

@case("seed_2_64")
def _():
    SamplingParams(temperature=1.0, seed=2**64)

@case("seed_below_int64")
def _():
    SamplingParams(temperature=1.0, seed=-(2**63) - 1)

@case("seed_bounds_accepted")
def _():
    return [SamplingParams(temperature=1.0, seed=s).seed for s in (2**63 - 1, -(2**63), 0)]

@case("seed_minus_one_means_none")
def _():
    return SamplingParams(temperature=1.0, seed=-1).seed

@case("what_the_v2_runner_would_hit")
def _():
    seeds = np.zeros(4, dtype=np.int64)
    seeds[0] = 2**64  # SamplingStates.add_request stores the seed like this
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_out_of_range_seed_is_a_validation_error(results):
    raised(results, "seed_2_64", "VLLMValidationError", "signed 64-bit", str(2**64))
    raised(results, "seed_below_int64", "VLLMValidationError", "signed 64-bit")


def test_int64_seeds_still_accepted(results):
    assert ok(results, "seed_bounds_accepted") == [2**63 - 1, -(2**63), 0]
    assert ok(results, "seed_minus_one_means_none") is None


def test_the_crash_being_prevented(results):
    raised(results, "what_the_v2_runner_would_hit", "OverflowError")
