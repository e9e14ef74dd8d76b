"""PG0002 (rejection-sampler inputs vs the target vocabulary) and PG0005 (draft length limit)."""

from __future__ import annotations

import pytest

from .conftest import ok, raised, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
from types import SimpleNamespace

import torch

from vllm.v1.sample import rejection_sampler as rs

ids = torch.tensor([1, 2, 3], dtype=torch.int32)       # 3 draft tokens
counts = [2, 1]                                          # over 2 requests
cu = torch.tensor([2, 3], dtype=torch.int32)
target = torch.randn(3, 100)                             # target vocab 100
bonus = torch.tensor([[5], [6]], dtype=torch.int32)

@case("draft_vocab_mismatch")
def _():
    # the real entry point; the guard fires before any kernel (none run on CPU)
    rs.rejection_sample(ids, counts, 2, cu, torch.rand(3, 90), target, bonus, None)

@case("counts_do_not_add_up")
def _():
    rs.rejection_sample(ids, [2, 2], 2, cu, None, target, bonus, None)

@case("bonus_rows")
def _():
    rs.rejection_sample(ids, counts, 2, cu, None, target, bonus[:1], None)

@case("consistent_inputs")
def _():
    return rs._sndr_check_rejection_inputs(ids, counts, cu, torch.rand(3, 100), target, bonus)

@case("too_many_spec_tokens")
def _():
    rs.RejectionSampler(SimpleNamespace(logprobs_mode="raw_logprobs"),
                        spec_config=SimpleNamespace(num_speculative_tokens=200))

@case("limit_value")
def _():
    return rs.MAX_SPEC_LEN

@case("per_step_limit")
def _():
    sampler = object.__new__(rs.RejectionSampler)
    rs.RejectionSampler.forward(sampler, SimpleNamespace(max_spec_len=rs.MAX_SPEC_LEN + 1), None, target, None)
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_draft_vocab_mismatch_is_named(results):
    raised(results, "draft_vocab_mismatch", "ValueError", "draft_probs has shape (3, 90)", "(90)", "(100)")


def test_inconsistent_counts_are_refused(results):
    raised(results, "counts_do_not_add_up", "ValueError", "sums to 4", "3 draft token ids")
    raised(results, "bonus_rows", "ValueError", "1 bonus tokens for 2 requests")


def test_consistent_inputs_pass(results):
    assert ok(results, "consistent_inputs") is None


def test_oversized_draft_length_refused_at_construction(results):
    limit = ok(results, "limit_value")
    raised(results, "too_many_spec_tokens", "ValueError", "num_speculative_tokens=200", f"exceeds {limit}")


def test_per_step_limit_is_an_explained_error_not_an_assert(results):
    raised(results, "per_step_limit", "ValueError", "draft tokens for one request", "at most")
