"""Issue 31 defect 6: a --via suggestion's class never contradicts the figures it shows.

A chain's class is earned hop by hop (each hop a calibrated comparison). It used to be shown beside
the anchor's similarity to the final text, which may lie below the class's cut-off after several
hops (P60-3 at 83 with `high`). The figures shown are now the weakest hop's, which meet the class's
cut-offs by construction; the end-to-end similarity is a reason.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sndr.preflight import hops
from sndr.preflight.models import HopStep
from sndr.preflight.suggest import HIGH_SCORE, HIGH_SIMILARITY, MEDIUM_SCORE, MEDIUM_SIMILARITY, Suggestion

ANCHOR = ("        num_computed = request.num_computed_tokens\n"
          "        num_scheduled = scheduler_output.num_scheduled_tokens[req_id]\n"
          "        total = num_computed + num_scheduled\n")
# Similarity (stripped lines): anchor->hop1 96, hop1->final 87, anchor->final 83.
HOP1 = ANCHOR.replace("num_computed", "n_computed").replace("request.", "req.")
FINAL = HOP1.replace("num_scheduled", "n_sched").replace("total", "total_tokens").replace("scheduler_output", "sched_out")


def _via(final: str, hop_figures: list[tuple[int, int, str]]):
    """A chain whose relocating hops had these (similarity, score, class), ending on ``final``."""
    last = hop_figures[-1]
    top = Suggestion(file="vllm/x.py", line=10, end_line=12, qualname="f", score=last[1], similarity=last[0],
                     text=final, confidence=last[2])
    st = hops._State(text=HOP1, file="vllm/x.py", qualname="f", line=10, scores=[f[1] for f in hop_figures],
                     sims=[f[0] for f in hop_figures], classes=[f[2] for f in hop_figures], last=[top],
                     path=[HopStep(version="0.24.0", file="vllm/x.py", how="pin")]
                     + [HopStep(version=f"0.{28 + i}.0", file="vllm/x.py", how="relocated", score=f[1],
                                confidence=f[2]) for i, f in enumerate(hop_figures)])
    chain = SimpleNamespace(states=[SimpleNamespace(snapshot=None)])
    return hops.chain_suggestion(chain, hops.Request(ANCHOR, "vllm/x.py", "f", 10), st)


def _consistent(s: Suggestion) -> bool:
    if s.confidence == "high":
        return s.similarity >= HIGH_SIMILARITY and s.score >= HIGH_SCORE
    if s.confidence == "medium":
        return s.similarity >= MEDIUM_SIMILARITY and s.score >= MEDIUM_SCORE
    return True


def test_two_high_hops_drifting_below_the_cut_off_end_to_end_show_the_hop_figures():
    s = _via(FINAL, [(96, 99, "high"), (87, 99, "high")])
    assert s.confidence == "high" and s.similarity == 87 and _consistent(s)
    assert "weakest hop similarity 87, end to end 83" in s.reasons  # the end-to-end figure is said, as a reason


@pytest.mark.parametrize("hop_figures, expect", [
    ([(100, 100, "high")], ("high", 100)),
    ([(96, 99, "high"), (70, 90, "medium")], ("medium", 70)),  # a weak hop caps the class and the figure
    ([(90, 85, "medium"), (99, 99, "high")], ("medium", 90)),
])
def test_class_and_figures_are_the_weakest_hops(hop_figures, expect):
    s = _via(FINAL, hop_figures)
    assert (s.confidence, s.similarity) == expect and _consistent(s)
