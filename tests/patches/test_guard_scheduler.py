"""PG0004: an ignored prefill_schedule_interval is reported at scheduler construction."""

from __future__ import annotations

import pytest

from .conftest import ok, run_cases

pytestmark = pytest.mark.vllm_install

SCRIPT = r'''
import inspect
import logging
from types import SimpleNamespace

import vllm.v1.core.sched.scheduler as sched

records = []

class Capture(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())

sched.logger.addHandler(Capture(level=logging.WARNING))

def warn(interval, dp):
    records.clear()
    fired = sched._sndr_warn_prefill_interval_noop(
        SimpleNamespace(prefill_schedule_interval=interval), SimpleNamespace(data_parallel_size=dp))
    return {"fired": fired, "logged": list(records)}

@case("single_engine_interval_4")
def _():
    return warn(4, 1)

@case("dp_engine_interval_4")
def _():
    return warn(4, 2)

@case("default_interval")
def _():
    return warn(1, 1)

@case("called_in_init")
def _():
    return "_sndr_warn_prefill_interval_noop(self.scheduler_config, self.parallel_config)" in inspect.getsource(
        sched.Scheduler.__init__)
'''


@pytest.fixture(scope="module")
def results(vllm_py, patched_pin_root):
    return run_cases(vllm_py, SCRIPT, patched_pin_root)


def test_warns_when_the_interval_is_ignored(results):
    r = ok(results, "single_engine_interval_4")
    assert r["fired"] is True
    assert len(r["logged"]) == 1
    assert "prefill_schedule_interval=4 has no effect" in r["logged"][0]


def test_silent_where_the_interval_applies_or_is_default(results):
    assert ok(results, "dp_engine_interval_4") == {"fired": False, "logged": []}
    assert ok(results, "default_interval") == {"fired": False, "logged": []}


def test_scheduler_constructor_calls_it(results):
    assert ok(results, "called_in_init") is True
