"""A multi-step serving simulation for the replayed GDN verify (tests only; CPU and GPU).

Three pools run the same schedule of steps:

* ``ref``: vLLM's snapshot semantics, naively, in float64 arithmetic (``reference.post_conv_mtp``:
  initial state from column ``num_accepted - 1``, token t's snapshot to column t), the pool in
  the tested dtype (a bf16 pool is rounded once per written snapshot, as vLLM rounds);
* ``snap``: sndr's PK0003 snapshot kernel on the same calls (``vllm_entry.try_post_conv_mtp``),
  the float32 arithmetic replay must equal;
* ``rep``: the replayed step (``replay.GdnReplay``), with ``materialize`` before a step that
  leaves replay (a "mixed batch": that step runs the snapshot kernel) and ``invalidate`` when a
  slot's new owner prefills.

A schedule: requests own ``cols`` slots each (from a free list, so freed slots are reused by
later requests in another order), arrive with a prefilled state in column 0 (num_accepted 1),
then take verify steps of 1..cols tokens in random batches (random subsets, random row order)
with num_accepted in [1, previous step's tokens]; some finish (slots freed), some steps are
mixed batches. After every step the outputs are compared; at the end every live request's
snapshots (the columns of its last step) are materialised and compared with ``ref``'s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from sndr.kernels.gdn import reference, replay, routing, vllm_entry


@dataclass
class Req:
    slots: list[int]
    last_t: int = 1  # tokens of the previous step (the prefill counts as 1, accepted 1)
    steps: int = 0


@dataclass
class Sim:
    H: int
    HV: int
    K: int
    V: int
    cols: int
    n_slots: int
    state_dtype: torch.dtype
    device: str
    seed: int
    act: str = "silu"
    backend: str | None = None  # GdnReplay's choice: the CUDA kernel on a GPU, Triton on the CPU
    log: list = field(default_factory=list)

    def __post_init__(self):
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        self.g = g
        dev = self.device
        init = (torch.randn(self.n_slots, self.HV, self.V, self.K, generator=g) * 0.1).to(self.state_dtype)
        self.ref = init.clone().to(dev)
        self.snap = init.clone().to(dev)
        self.rep_state = init.clone().to(dev)
        self.A_log = (torch.rand(self.HV, generator=g) * 2 - 1).to(dev)
        self.dt_bias = (torch.rand(self.HV, generator=g) * 2 - 1).to(dev)
        self.w = (torch.rand(self.V, generator=g) + 0.5).to(torch.bfloat16).to(dev)
        self.scale = self.K ** -0.5
        self.eps = 1e-6
        self.rep = replay.GdnReplay(self.rep_state, self.H, max_tokens=self.cols, max_requests=64,
                                    backend=self.backend)
        self.free = list(range(1, self.n_slots))
        self.rng.shuffle(self.free)
        self.live: dict[int, Req] = {}
        self.next_id = 0
        self.max_out_err = 0.0

    # --- the schedule -------------------------------------------------------------------

    def admit(self) -> bool:
        if len(self.free) < self.cols:
            return False
        slots = [self.free.pop() for _ in range(self.cols)]
        # the prefill: a fresh state in column 0 of all three pools (has_initial_state false)
        st = (torch.randn(self.HV, self.V, self.K, generator=self.g) * 0.1).to(self.state_dtype).to(self.device)
        for pool in (self.ref, self.snap, self.rep_state):
            pool[slots[0]] = st
        self.rep.invalidate(torch.tensor([slots[0]], device=self.device))
        self.live[self.next_id] = Req(slots)
        self.log.append(("admit", self.next_id, slots))
        self.next_id += 1
        return True

    def finish(self, rid: int) -> None:
        req = self.live.pop(rid)
        self.free = req.slots[::-1] + self.free  # reused soon, in another column order
        self.rng.shuffle(self.free[: self.cols * 2])
        self.log.append(("finish", rid))

    def _inputs(self, n_tok: int):
        g, dev = self.g, self.device
        width = 2 * self.H * self.K + self.HV * self.V
        qkvz = torch.randn(n_tok, width + self.HV * self.V, generator=g).to(torch.bfloat16).to(dev)
        ba = torch.randn(n_tok, 2 * self.HV, generator=g).to(torch.bfloat16).to(dev)
        mixed = qkvz[:, :width]
        gate = qkvz[:, width:].view(n_tok, self.HV, self.V)
        b, a = ba.chunk(2, dim=-1)
        return mixed, a, b, gate

    def step(self, rids: list[int], mixed_batch: bool, full_acceptance: float = 0.3) -> None:
        dev = self.device
        reqs = [self.live[r] for r in rids]
        accs, ts = [], []
        for req in reqs:
            if self.rng.random() < full_acceptance:
                accs.append(req.last_t)
            else:
                accs.append(self.rng.randint(1, req.last_t))
            ts.append(self.rng.randint(1, self.cols))
        idx = torch.tensor([r.slots for r in reqs], dtype=torch.int32, device=dev)
        acc = torch.tensor(accs, dtype=torch.int32, device=dev)
        cu = torch.tensor([0] + list(torch.tensor(ts).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        n_tok = int(cu[-1])
        mixed, a, b, gate = self._inputs(n_tok)
        # ref: float64 arithmetic on the pool of the tested dtype
        o_ref = reference.post_conv_mtp(mixed, a, b, self.A_log, self.dt_bias, idx, cu, acc, self.ref, gate,
                                        self.w, self.scale, self.eps, self.act, dtype=torch.float64)
        out_s = torch.full((n_tok, self.HV, self.V), float("nan"), dtype=torch.bfloat16, device=dev)
        with routing.measuring():  # PK0003's kernel itself, in every cell (its default routing is not the point)
            r = vllm_entry.try_post_conv_mtp(mixed, a, b, self.A_log, self.dt_bias, idx, cu, acc, self.snap, gate,
                                             self.w, out_s, self.scale, self.eps, self.act)
        assert r is not None, "PK0003's kernel refused the call"
        out_r = torch.full_like(out_s, float("nan"))
        if mixed_batch:  # leaves replay: vLLM's snapshot path runs this step
            self.rep.materialize(idx[:, 0])
            with routing.measuring():
                r2 = vllm_entry.try_post_conv_mtp(mixed, a, b, self.A_log, self.dt_bias, idx, cu, acc,
                                                  self.rep_state, gate, self.w, out_r, self.scale, self.eps, self.act)
            assert r2 is not None
        else:
            self.rep.step(mixed, a, b, self.A_log, self.dt_bias, idx, cu, acc, self.rep_state, gate, self.w, out_r,
                          self.scale, self.eps, self.act)
        self.log.append(("step", rids, accs, ts, mixed_batch))
        self.last = (o_ref, out_s, out_r)
        for req, t in zip(reqs, ts):
            req.last_t = t
            req.steps += 1

    # --- the end state ------------------------------------------------------------------

    def final_snapshots(self):
        """(ref, snap, rep) states of every live request's columns after materialising replay."""
        if not self.live:
            return None
        cols0 = torch.tensor([r.slots[0] for r in self.live.values()], device=self.device)
        self.rep.materialize(cols0)
        # the columns a request's last step wrote (column t for t < last_t)
        sl = [s for r in self.live.values() for s in r.slots[: r.last_t]]
        ix = torch.tensor(sl, device=self.device).long()
        return self.ref[ix], self.snap[ix], self.rep_state[ix]


def run_schedule(sim: Sim, ops: list[tuple[str, int]], check) -> Sim:
    """Drive ``sim`` with abstract operations: ('admit', _), ('finish', k), ('step', mask), ('mixed', mask);
    ``check(sim)`` after every step."""
    for op, arg in ops:
        if op == "admit":
            sim.admit()
        elif op == "finish" and sim.live:
            rid = list(sim.live)[arg % len(sim.live)]
            sim.finish(rid)
        elif op in ("step", "mixed") and sim.live:
            ids = list(sim.live)
            chosen = [r for i, r in enumerate(ids) if (arg >> (i % 16)) & 1] or ids[:1]
            sim.rng.shuffle(chosen)
            sim.step(chosen, op == "mixed")
            check(sim)
    return sim
