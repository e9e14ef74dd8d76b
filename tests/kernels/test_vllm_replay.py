"""PK0004's route of the replayed spec verify, on vLLM 0.32.0's own Qwen GDN layer, over many steps.

The layer methods are executed from the wheel's source, as in ``test_gdn_vllm_layer.py`` (whose
harness this extends): ``_forward_core_fused_norm`` and what it calls, now also ``_forward_core``'s
mixed and prefill paths and ``rearrange_mixed_qkv``. Two layers share weights and start from the
same pools; one runs vLLM's method as it stands (**unpatched**), the other the same method wrapped
by PK0004's runtime wrapper (``sndr.runtime_patches.gdn_replay``, as the startup hook installs it;
its ``__init__`` wrapper records the stand-in ``vllm_config``). A schedule of steps drives both:

* requests admitted by a prefill-only batch (``has_initial_state`` false);
* pure spec-verify batches (the ones vLLM sends to ``fused_gdn_decode_post_conv_mtp``): the
  route runs ``GdnReplay.step``, with ``num_accepted_tokens`` drawn in [1, previous T]
  (Hypothesis), a step rejecting everything (all 1), a ragged step;
* a request finishing and a new request taking its slots in another column order, its prompt in
  a mixed batch with spec rows (the route invalidates the reused column-0 slot) and its second
  chunk (``has_initial_state`` true) in the next mixed batch;
* a mixed batch with a non-spec one-token row (vLLM reclassifies it as a prefill with an initial
  state: the route materialises it) and a pure plain-decode batch (``_forward_core_decode_non_spec``:
  materialised).

What is compared to what:

* **CPU** (Triton interpreter; H = 1, HV = 2, K = V = 16, 3 columns): vLLM's CUDA op cannot run. The unpatched layer's pure
  spec batches take vLLM's default branch (``_can_use_fused_gdn_mtp_decode`` true: the op is
  visible through a stand-in ``torch.ops._C`` in the methods' globals) down to
  ``ops.fused_gdn_decode_post_conv_mtp``, which is PK0003's snapshot kernel
  (``sndr.runtime_patches.gdn.wrap_post_conv_mtp``, every cell taken); on the GPU that kernel
  equals vLLM's op within ``test_gdn_vllm_layer.py``'s tolerances. Mixed batches run vLLM's
  ``_forward_core`` with vLLM's Triton ``fused_sigmoid_gating_delta_rule_update`` (spec rows),
  plain decode vLLM's Triton packed decode, the norm vLLM's Triton ``layer_norm_fwd_kernel``
  (all from the wheel's copies); the causal conv, ``fused_post_conv_prep`` and the chunked
  prefill are stand-ins (a float32 recurrence), the same functions on both sides. The patched
  layer's replayed steps run ``GdnReplay``'s Triton kernels. Required **bit for bit**: every
  step's outputs, and after every step the pool any later reader can observe: the patched pool
  with every live request's pending entry materialised (on a copy; the run continues from the
  un-materialised pool) against the unpatched pool, on each live request's columns that its
  next step may read (columns [0, T) after a spec step of T tokens, column 0 after a prefill or
  plain decode); slots never given to a request equal everywhere (no stray write); the conv
  calls receive the same arguments.
* **GPU**: the unpatched side runs vLLM's CUDA op (``.gpu/_C_stable_libtorch.abi3.so``), the
  patched side ``GdnReplay``'s default (CUDA) backend; outputs within relative L2 4e-3, observed
  states within 1e-5 (fp32 pool) / 4e-3 (bf16), as ``test_gdn_vllm_layer.py``.
"""

from __future__ import annotations

import logging
import types

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
pytest.importorskip("triton", reason="triton unavailable (install the [kernels] extra)")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the [test] extra)")

import test_gdn_vllm_layer as L  # noqa: E402  (skips this module too when the wheel's copy is absent)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sndr.errors import CODES  # noqa: E402
from sndr.kernels.gdn import _vllm_baseline, replay, routing, vllm_replay  # noqa: E402
from sndr.runtime_patches import gdn as gdn_patch  # noqa: E402
from sndr.runtime_patches import gdn_replay as route_patch  # noqa: E402

CUDA, DEV, BF = L.CUDA, L.DEV, L.BF
H, HV, K, V = (L.H, L.HV, L.K, L.V) if CUDA else (1, 2, 16, 16)  # the interpreter: small heads
if CUDA:
    pytestmark = [pytest.mark.gpu, pytest.mark.triton_interpreter]
else:
    pytestmark = pytest.mark.triton_interpreter
NUM_SPEC = 2
COLS = NUM_SPEC + 1
SLOTS = 26
WIDTH = 2 * H * K + HV * V
METHODS = (*L.METHODS, "rearrange_mixed_qkv")


# ----------------------------------------------------------------------------- stand-ins, same on both sides


def _silu(x):
    return torch.nn.functional.silu(x.float()).to(x.dtype)


def _conv_fn(x, weight, bias=None, activation=None, conv_states=None, has_initial_state=None, cache_indices=None,
             query_start_loc=None, metadata=None, **_):
    """Stands for ``causal_conv1d_fn`` (prefill conv, ``[dim, tokens]`` in and out)."""
    return _silu(x)


def _post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim, apply_l2norm=True,
                    output_g_exp=False):
    """Stands for ``fused_post_conv_prep``: q, k (L2-normalised), v, log decay g, beta, per token."""
    t = conv_output.shape[0]
    x = conv_output.float()
    q = x[:, : num_k_heads * head_k_dim].reshape(t, num_k_heads, head_k_dim)
    k = x[:, num_k_heads * head_k_dim: 2 * num_k_heads * head_k_dim].reshape(t, num_k_heads, head_k_dim)
    v = x[:, 2 * num_k_heads * head_k_dim:].reshape(t, -1, head_v_dim)
    if apply_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    dt = conv_output.dtype  # q, k, v in the activations' dtype, g and beta in float32
    return q.to(dt), k.to(dt), v.to(dt), (g.exp() if output_g_exp else g), beta


def _chunk_rule(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, **_):
    """Stands for the chunked prefill: the gated delta rule per sequence in float32, state [HV, V, K]."""
    out = torch.zeros(1, q.shape[1], v.shape[2], v.shape[3], dtype=torch.float32, device=q.device)
    final = initial_state.float().clone()
    grp = v.shape[2] // q.shape[2]
    scale = q.shape[-1] ** -0.5
    for n in range(cu_seqlens.numel() - 1):
        s = final[n]
        for t in range(int(cu_seqlens[n]), int(cu_seqlens[n + 1])):
            qt = q[0, t].float().repeat_interleave(grp, 0) * scale
            kt = k[0, t].float().repeat_interleave(grp, 0)
            s = s * g[0, t].exp()[:, None, None]
            u = (v[0, t].float() - (s * kt[:, None, :]).sum(-1)) * beta[0, t][:, None]
            s = s + u[:, :, None] * kt[:, None, :]
            out[0, t] = (s * qt[:, None, :]).sum(-1)
        final[n] = s
    return out.to(v.dtype), final


class _TorchWithOp(types.ModuleType):
    """The methods' ``torch`` on the CPU: real torch, with ``torch.ops._C.fused_gdn_decode_post_conv_mtp``
    visible, so ``_can_use_fused_gdn_mtp_decode`` picks vLLM's default branch (the op itself is called
    through ``ops.``, PK0003's snapshot kernel here)."""

    def __init__(self):
        super().__init__("torch")
        self.ops = types.SimpleNamespace(_C=types.SimpleNamespace(fused_gdn_decode_post_conv_mtp=object()))

    def __getattr__(self, name):
        return getattr(torch, name)


def _no_op(*_a, **_k):
    raise AssertionError("PK0003's snapshot kernel must take every call of the CPU harness")


@pytest.fixture(scope="module")
def harness():
    if CUDA and L.OP is None:
        pytest.skip(f"vLLM's CUDA op not loadable ({L.LIB}): the GPU variant compares against it")
    vl = _vllm_baseline.load(L.SRC)
    norm_fn = _vllm_baseline.load_norm(L.SRC)
    ns: dict = {"__name__": "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
                "torch": torch if CUDA else _TorchWithOp()}
    methods = L._layer_methods(ns, METHODS)
    ops_fn = L._ops_wrapper({"torch": torch}) if CUDA else gdn_patch.wrap_post_conv_mtp(_no_op)
    ctx = types.SimpleNamespace(attn_metadata=None)
    calls: list = []

    def conv_update(x, conv_state, weight, bias, activation, conv_state_indices=None, num_accepted_tokens=None,
                    query_start_loc=None, max_query_len=-1, validate_data=False):
        calls.append(tuple(None if t is None else (t.clone() if isinstance(t, torch.Tensor) else t)
                           for t in (conv_state_indices, num_accepted_tokens, query_start_loc, max_query_len)))
        return L._conv_standin(x, conv_state, weight, bias, activation)

    ns.update(get_forward_context=lambda: ctx, GDNAttentionMetadata=L.GDNAttentionMetadata,
              is_conv_state_dim_first=lambda: True, causal_conv1d_update=conv_update, causal_conv1d_fn=_conv_fn,
              fused_post_conv_prep=_post_conv_prep,
              fused_recurrent_gated_delta_rule_packed_decode=vl.packed_decode,
              fused_sigmoid_gating_delta_rule_update=vl.sigmoid_gating_update,
              ops=types.SimpleNamespace(fused_gdn_decode_post_conv_mtp=ops_fn))
    return types.SimpleNamespace(ns=ns, methods=methods, ctx=ctx, norm_fn=norm_fn, calls=calls)


@pytest.fixture(autouse=True)
def _every_cell():
    with routing.measuring():  # PK0003's snapshot kernel (the CPU stand-in of vLLM's op) takes every cell
        yield


# ----------------------------------------------------------------------------- the two layers


class _VllmConfig(types.SimpleNamespace):
    pass


def _vllm_config(mode="none", kv_transfer=None, max_num_seqs=8, num_spec=NUM_SPEC):
    return _VllmConfig(cache_config=types.SimpleNamespace(mamba_cache_mode=mode, use_replayssm=False),
                       speculative_config=types.SimpleNamespace(num_speculative_tokens=num_spec),
                       scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
                       kv_transfer_config=kv_transfer)


class Weights:
    def __init__(self, state_dtype, seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        self.ssm = (torch.randn(SLOTS, HV, V, K, generator=g, device=DEV) * 0.3).to(state_dtype)
        self.conv = torch.randn(SLOTS, WIDTH, 3, generator=g, device=DEV).to(BF)
        self.A_log = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.dt_bias = torch.rand(HV, generator=g, device=DEV) * 2 - 1
        self.w = (torch.rand(V, generator=g, device=DEV) + 0.5).to(BF)
        self.conv_w = torch.randn(WIDTH, 1, 4, generator=g, device=DEV).to(BF)


def _layer(h, wts: Weights, patched: bool, config=None):
    attrs = dict(h.methods)
    if patched:
        attrs["_forward_core_fused_norm"] = route_patch.wrap_forward_core_fused_norm(h.methods["_forward_core_fused_norm"])
        attrs["__init__"] = route_patch.wrap_layer_init(lambda self, config, vllm_config, prefix="",
                                                        gqa_interleaved_layout=False, reduce_results=True: None)
    cls = type("QwenGatedDeltaNetAttention", (), attrs)
    lay = cls(None, config or _vllm_config()) if patched else cls()
    L.stand_in_layer(lay, (wts.conv.clone(), wts.ssm.clone()), wts.conv_w, wts.A_log, wts.dt_bias, wts.w,
                     (H, HV, K, V))
    lay.key_dim, lay.value_dim = H * K, HV * V
    lay.chunk_gated_delta_rule = _chunk_rule
    return lay


# ----------------------------------------------------------------------------- batches in vLLM's layout


def _i32(x):
    return torch.tensor(x, dtype=torch.int32, device=DEV)


def _metadata(rows, blocks, acc):
    """vLLM's ``GDNAttentionMetadataBuilder.build`` for one batch, mamba_cache_mode 'none'.

    ``rows``: (kind, request, tokens[, has_initial_state]) with kind 'spec', 'prefill' or 'decode',
    spec rows first (vLLM's decode-first order); ``blocks[r]``: the request's block-table row."""
    kinds = [r[0] for r in rows]
    lens = [r[2] for r in rows]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    tok = qsl[-1]
    spec = [i for i, k in enumerate(kinds) if k == "spec"]
    non = [i for i, k in enumerate(kinds) if k != "spec"]
    md = L.GDNAttentionMetadata(
        num_actual_tokens=tok, num_decode_tokens=0, num_spec_decode_tokens=0, num_prefill_tokens=0,
        has_initial_state=None, spec_query_start_loc=None, non_spec_query_start_loc=None,
        spec_state_indices_tensor=None, non_spec_state_indices_tensor=None, spec_sequence_masks=None,
        spec_token_indx=None, non_spec_token_indx=None, num_accepted_tokens=None, chunk_indices=None,
        chunk_offsets=None, prefill_query_start_loc=None, prefill_state_indices=None,
        prefill_has_initial_state=None, aiter_prefill_metadata=None, num_spec_decodes=len(spec))
    if spec:
        md.spec_sequence_masks = torch.tensor([k == "spec" for k in kinds], device=DEV)
        md.spec_state_indices_tensor = _i32([blocks[rows[i][1]] for i in spec])
        md.num_accepted_tokens = _i32([acc[rows[i][1]] for i in spec])
        sq = [0]
        for i in spec:
            sq.append(sq[-1] + lens[i])
        md.spec_query_start_loc = _i32(sq)
        md.num_spec_decode_tokens = sq[-1]
        md.num_decodes, md.num_prefills = 0, len(non)  # vLLM reclassifies non-spec decodes as prefills
        spec_tok = [t for i in spec for t in range(qsl[i], qsl[i + 1])]
        non_tok = [t for i in non for t in range(qsl[i], qsl[i + 1])]
        md.spec_token_indx = torch.tensor(spec_tok, dtype=torch.long, device=DEV)
        md.non_spec_token_indx = torch.tensor(non_tok, dtype=torch.long, device=DEV)
    else:
        md.num_decodes = sum(1 for k in kinds if k == "decode")
        md.num_prefills = len(rows) - md.num_decodes
        assert not (md.num_decodes and md.num_prefills), "the harness builds no split non-spec batch"
        md.num_decode_tokens = md.num_decodes
    if non:
        md.non_spec_state_indices_tensor = _i32([blocks[rows[i][1]][0] for i in non])
        nq = [0]
        for i in non:
            nq.append(nq[-1] + lens[i])
        md.non_spec_query_start_loc = _i32(nq)
    if md.num_prefills:
        md.num_prefill_tokens = sum(lens[i] for i in non)
        md.has_initial_state = torch.tensor([bool(rows[i][3]) if len(rows[i]) > 3 else True for i in non],
                                            device=DEV)
        md.prefill_state_indices = md.non_spec_state_indices_tensor
        md.prefill_has_initial_state = md.has_initial_state
        md.prefill_query_start_loc = md.non_spec_query_start_loc
    return md


class Run:
    """Both layers through one schedule; every step compared."""

    def __init__(self, h, state_dtype, seed=0, config=None):
        self.h, self.state_dtype = h, state_dtype
        wts = Weights(state_dtype, seed)
        self.vllm, self.sndr = _layer(h, wts, False), _layer(h, wts, True, config)
        self.gen = torch.Generator(device=DEV).manual_seed(seed + 1)
        self.free = list(range(1, SLOTS))  # slot 0: vLLM's NULL block
        self.blocks: dict[int, list[int]] = {}
        self.acc: dict[int, int] = {}
        self.readable: dict[int, int] = {}  # request -> columns its next step may read
        self.ever: set[int] = set()
        self.replayed = 0

    def admit(self, r, reuse: list[int] | None = None):
        row = list(reuse) if reuse else [self.free.pop(0) for _ in range(COLS)]
        for s in row:
            if s in self.free:
                self.free.remove(s)
        self.blocks[r] = row
        self.ever.update(row)

    def finish(self, r) -> list[int]:
        row = self.blocks.pop(r)
        self.acc.pop(r, None)
        self.readable.pop(r, None)
        return row

    def step(self, rows, expect_replay: bool = True):
        """One batch through both layers; compare outputs and the observable pools. A pure spec batch
        must have been replayed (``expect_replay``), every other batch must not."""
        h = self.h
        md = _metadata(rows, self.blocks, self.acc)
        tok = md.num_actual_tokens
        qkvz = torch.randn(tok, WIDTH + HV * V, generator=self.gen, device=DEV).to(BF)
        ba = torch.randn(tok, 2 * HV, generator=self.gen, device=DEV).to(BF)
        outs, calls = [], []
        before = vllm_replay.STATS.get("replayed", 0)
        for lay in (self.vllm, self.sndr):
            h.calls.clear()
            h.ctx.attn_metadata = {lay.prefix: md}
            x = qkvz.clone()
            b, a = ba.clone().chunk(2, dim=-1)
            out = torch.zeros(tok, HV, V, dtype=BF, device=DEV)
            lay._forward_core_fused_norm(x[:, :WIDTH], b, a, x[:, WIDTH:].view(tok, HV, V), out)
            outs.append(out)
            calls.append(list(h.calls))
        pure = md.spec_sequence_masks is not None and md.num_prefills == 0 and md.num_decodes == 0
        took = vllm_replay.STATS.get("replayed", 0) - before
        assert took == (1 if pure and expect_replay else 0), (rows, took)
        self.replayed += took
        assert _same_calls(*calls)
        for kind, r, n, *_ in rows:
            if kind == "spec":
                self.readable[r] = n
                self.acc[r] = int(torch.randint(1, n + 1, (1,), generator=self.gen, device=DEV))
            else:
                self.readable[r] = 1
                self.acc[r] = 1
        self.check(outs[1], outs[0], what=str(rows))

    def observed(self) -> torch.Tensor:
        """The patched pool with every live request's pending entry materialised (on a copy)."""
        rep = vllm_replay._REPLAYS.get(self.sndr)
        if rep is None:
            return self.sndr.kv_cache[1].clone()
        keep = [t.clone() for t in (rep.state, rep.side.meta)]
        live = _i32([row[0] for row in self.blocks.values()])
        rep.materialize(live)
        seen = rep.state.clone()
        rep.state.copy_(keep[0])
        rep.side.meta.copy_(keep[1])
        return seen

    def check(self, out, ref, what=""):
        seen, base = self.observed(), self.vllm.kv_cache[1]
        cols = [s for r, row in self.blocks.items() for s in row[: self.readable.get(r, 0)]]
        never = [s for s in range(SLOTS) if s not in self.ever]
        if CUDA:
            assert L.rel(out, ref) <= 4e-3, what
            if cols:
                assert L.rel(seen[cols], base[cols]) <= L._state_tol(self.state_dtype), what
        else:
            assert torch.equal(out, ref), f"outputs differ: {what} (max {(out.float() - ref.float()).abs().max()})"
            assert torch.equal(seen[cols], base[cols]), f"observable pool differs: {what}"
        assert torch.equal(self.sndr.kv_cache[1][never], base[never]), "a slot no request owns was written"
        assert torch.equal(self.sndr.kv_cache[0], self.vllm.kv_cache[0])


def _same_calls(a, b) -> bool:
    if len(a) != len(b):
        return False
    for ca, cb in zip(a, b):
        for x, y in zip(ca, cb):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                    return False
            elif x != y:
                return False
    return True


def schedule(run: Run, draw_acc=None):
    """The multi-step schedule (module docstring); ``draw_acc(request, T)`` overrides the accepted counts."""

    def spec(reqs, t=COLS, rows_extra=(), reject=False):
        for r in reqs:
            if draw_acc is not None and run.readable.get(r, 1) > 1:
                run.acc[r] = draw_acc(r, run.readable[r])
            if reject:
                run.acc[r] = 1
        lens = t if isinstance(t, dict) else dict.fromkeys(reqs, t)
        run.step([("spec", r, lens[r]) for r in reqs] + list(rows_extra))

    for r in (0, 1, 2):
        run.admit(r)
    run.step([("prefill", 0, 5, False), ("prefill", 1, 3, False), ("prefill", 2, 4, False)])
    spec([0, 1, 2])                          # first spec step after the prompts: no entries yet
    spec([0, 1, 2])
    spec([0, 1, 2], reject=True)             # every draft rejected: only the bonus token counts
    spec([0, 1, 2], t={0: 3, 1: 2, 2: 3})    # ragged
    old = run.finish(2)                      # request 2 finishes; 3 takes its slots, another column order
    run.admit(3, reuse=[old[2], old[0], old[1]])
    run.admit(4)
    spec([0, 1], rows_extra=[("prefill", 3, 4, False), ("prefill", 4, 3, False)])  # invalidates reused slots
    spec([0, 1, 3], rows_extra=[("prefill", 4, 2, True)])                          # a second prompt chunk
    spec([0, 1, 3, 4])
    spec([1, 3, 4], rows_extra=[("prefill", 0, 1, True)])  # a non-spec one-token row: a prefill with state
    spec([0, 1, 3, 4])
    run.step([("decode", r, 1) for r in (0, 1, 3, 4)])     # pure plain decode: vLLM's packed decode
    spec([0, 1, 3, 4])
    old = run.finish(1)                                    # reuse in the same column order, then replay it
    run.admit(5, reuse=old)
    spec([0, 3, 4], rows_extra=[("prefill", 5, 3, False)])
    spec([0, 3, 4, 5])
    spec([0, 3, 4, 5])
    assert run.replayed >= 9


@pytest.mark.parametrize("state_dtype", [torch.float32, BF], ids=["fp32", "bf16"])
def test_route_equals_vllms_layer_over_a_schedule(harness, state_dtype, monkeypatch, caplog):
    L._install_norm(harness, monkeypatch)
    caplog.set_level(logging.WARNING, logger="sndr.kernels")
    vllm_replay._LOGGED.clear()
    run = Run(harness, state_dtype, seed=11)
    schedule(run)
    rep = vllm_replay._REPLAYS[run.sndr]
    assert rep.backend in (("cuda", "triton") if CUDA else ("triton",))
    assert rep.TM == 4 and rep.side.counter.numel() == 8 * HV  # sized from max_num_seqs and the spec tokens
    logged = [r.getMessage() for r in caplog.records if "PK0004: [" in r.getMessage()]
    assert len([m for m in logged if "[gdn_replay_mixed_batch]" in m]) == 1, logged  # once per reason
    assert "side buffer" in caplog.text and "outside vLLM's memory profiling" in caplog.text


def _random_acceptance(harness, data, monkeypatch):
    L._install_norm(harness, monkeypatch)
    state_dtype = data.draw(st.sampled_from([torch.float32, BF]), label="pool dtype")

    def draw_acc(r, t):
        return data.draw(st.one_of(st.just(t), st.integers(1, t)), label=f"acc r{r}")

    schedule(Run(harness, state_dtype, seed=data.draw(st.integers(0, 1000), label="seed")), draw_acc)


_HYP = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# The interpreter runs a schedule in about 10 s: two in the fast tier, 12 with --slow.
@pytest.mark.skipif(CUDA, reason="the Hypothesis schedules run on the CPU interpreter; the GPU runs the fixed one")
@settings(max_examples=2, derandomize=True, **_HYP)
@given(data=st.data())
def test_route_equals_vllms_layer_random_acceptance(harness, data, monkeypatch):
    """The schedule with every num_accepted_tokens drawn by Hypothesis (full acceptance favoured)."""
    _random_acceptance(harness, data, monkeypatch)


@pytest.mark.slow
@pytest.mark.skipif(CUDA, reason="the Hypothesis schedules run on the CPU interpreter; the GPU runs the fixed one")
@settings(max_examples=12, **_HYP)
@given(data=st.data())
def test_route_equals_vllms_layer_random_acceptance_long(harness, data, monkeypatch):
    _random_acceptance(harness, data, monkeypatch)


@pytest.mark.parametrize("config,code", [
    (dict(mode="align"), "gdn_replay_prefix_caching"),
    (dict(kv_transfer=object()), "gdn_replay_kv_transfer"),
    (dict(max_num_seqs=1), "gdn_replay_unsupported"),  # more requests than the buffer was sized for
])
def test_refused_batches_keep_vllms_path_and_say_why(harness, config, code, monkeypatch, caplog):
    """A pure spec batch the route refuses runs vLLM's path, bit for bit as unpatched, logged once with
    its registered code; nothing is replayed."""
    L._install_norm(harness, monkeypatch)
    caplog.set_level(logging.WARNING, logger="sndr.kernels")
    vllm_replay._LOGGED.clear()
    assert code in CODES and code in replay.FALLBACKS
    run = Run(harness, torch.float32, seed=5, config=_vllm_config(**config))
    for r in (0, 1):
        run.admit(r)
    run.step([("prefill", 0, 3, False), ("prefill", 1, 2, False)])
    for _ in range(3):
        run.step([("spec", 0, COLS), ("spec", 1, COLS)], expect_replay=False)
        assert torch.equal(run.vllm.kv_cache[1], run.sndr.kv_cache[1])  # the whole pool: snapshots as vLLM's
    if code != "gdn_replay_unsupported":  # a refusal fixed by the config: no side buffer is ever allocated
        assert run.sndr not in vllm_replay._REPLAYS
    msgs = [r.getMessage() for r in caplog.records if f"[{code}]" in r.getMessage()]
    assert len(msgs) == 1, msgs


def test_no_config_recorded_keeps_vllms_path(harness, monkeypatch, caplog):
    """A layer whose ``__init__`` wrapper did not run (PK0004 installed after the model was built) is never
    replayed: vLLM's path, the reason logged with its code."""
    L._install_norm(harness, monkeypatch)
    caplog.set_level(logging.WARNING, logger="sndr.kernels")
    vllm_replay._LOGGED.clear()
    run = Run(harness, torch.float32, seed=2)
    vllm_replay._CONFIG.pop(run.sndr)
    run.admit(0)
    run.step([("prefill", 0, 2, False)])
    run.step([("spec", 0, COLS)], expect_replay=False)
    run.step([("spec", 0, COLS)], expect_replay=False)
    assert "[gdn_replay_unsupported]" in caplog.text and "was not recorded" in caplog.text
    assert torch.equal(run.vllm.kv_cache[1], run.sndr.kv_cache[1])
