"""PK0003's CUDA step (``sndr/kernels/gdn/step.cu``, launcher ``cuda_step``) on a machine without a GPU.

* ``step.cu`` compiles with NVRTC for sm_90 at every launch shape ``cuda_step.pick_config``
  ships (every measured batch and T of the routing table, both pool dtypes, the MTP op's
  call and the packed decode, bf16 and fp16 activations, SiLU and sigmoid gates, int32 and
  int64 indices), with no local memory and no stack (``cuobjdump --dump-resource-usage``,
  the one Triton's package carries);
* the launcher's argument plumbing: :data:`cuda_step.PARAMS` (what ``CudaStep`` packs, in
  order, with their kinds) is exactly the kernel's parameter list in ``step.cu``, and
  ``scalar_values`` puts each stride of a call layout where the kernel reads it;
* where the CUDA step does not take a call (CPU tensors, launch shapes it cannot build),
  ``why_not`` / ``config_why`` say why (the entries then run the Triton step).

The numerical tests of the kernel (float64, vLLM's CUDA op, graph replay, vLLM's layer)
are ``test_gdn_norm_gpu.py`` and ``test_gdn_vllm_layer.py`` (parametrised by kernel).
"""

from __future__ import annotations

import re
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (install the [kernels] extra)")
pytest.importorskip("triton", reason="triton unavailable (install the [kernels] extra)")

from test_mtp_verify import _cuobjdump, _nvrtc_or_skip  # noqa: E402  (one home for the cubin tools)

from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.gdn import cuda_step, routing  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
BF = torch.bfloat16


def _shipped():
    """(state dtype, spec, TM, config) of every cell the routing table measures."""
    seen = set()
    for dt in (torch.float32, BF):
        for n in routing.BATCHES:
            for t in routing.TS:
                spec = t > 1
                tm = min(cuda_step.MAX_TM, 1 << max(0, (t - 1).bit_length()))
                seen.add((dt, spec, tm, cuda_step.pick_config(n, HV, V, K, dt, t)))
    return sorted(seen, key=str)


def _offered():
    """(state dtype, spec, TM, config) of every shape of ``cuda_step.TWIN_SHAPES`` at every TM the benchmark times it
    at (1, 2, 4, 8; not TM 1 for the spec-verify-only ``cb`` shapes, as ``bench_gdn.prebuild``)."""
    return [(dt, tm > 1, tm, cfg) for cfg in map(cuda_step.CudaConfig.parse, cuda_step.TWIN_SHAPES)
            for dt in (torch.float32, BF) for tm in (1, 2, 4, 8) if tm > 1 or not cfg.spec_only()]


@pytest.mark.parametrize("state_dtype,spec,tm,cfg", _shipped() + _offered())
def test_every_shipped_launch_shape_compiles_for_sm90_without_local_memory(state_dtype, spec, tm, cfg, tmp_path,
                                                                           monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    assert cuda_step.config_why(K, V, state_dtype, cfg) is None
    s_kind = 0 if state_dtype == torch.float32 else 2
    variants = [dict(x=2, gate=0, i64=False), dict(x=1, gate=1, i64=True)]  # the layer's call; fp16, sigmoid, int64
    tool = _cuobjdump()
    for v in variants:
        kinds = {"X_KIND": v["x"], "AB_KIND": v["x"], "ALOG_KIND": 0, "DT_KIND": 0, "Z_KIND": v["x"],
                 "W_KIND": 2, "O_KIND": v["x"], "S_KIND": s_kind}
        defs = cuda_step.defines(H, HV, K, V, cfg, spec=spec, tm=tm, kinds=kinds, sigmoid_gate=bool(v["gate"]),
                                 idx64=v["i64"], acc64=v["i64"], cu64=v["i64"])
        cubin = _cudart.compile_cubin(cuda_step.source(), "gdn_step", "90", defs, cache=False)
        assert cubin[:4] == b"\x7fELF" and cuda_step.KERNEL.encode() in cubin
        if tool is None:
            continue
        f = tmp_path / "step.cubin"
        f.write_bytes(cubin)
        usage = subprocess.run([tool, "--dump-resource-usage", str(f)], capture_output=True, text=True).stdout
        lines = [ln for ln in usage.splitlines() if "REG:" in ln]
        assert len(lines) == 1, usage
        regs = int(re.search(r"REG:(\d+)", lines[0]).group(1))
        stack = int(re.search(r"STACK:(\d+)", lines[0]).group(1))
        cap = 65536 // (cfg.threads() * defs["MINB"]) // 8 * 8  # the register cap __launch_bounds__ asks for
        # No local memory, and no stack frame, except one 8-byte slot at the register cap: NVRTC 13.0 (the H200
        # host's, torch 2.11+cu130) keeps one value on the stack (1 store, 1-2 loads) in two bf16 shapes that
        # MINB 8 caps at 64 registers, which NVRTC 13.5 fits in registers; the benchmark measured them with it.
        # cuda_step.SPILL_AT_CAP_SHAPES (five CTAs per SM, 96 registers) keep a stack of up to 56 bytes at the cap (its
        # comment: the benchmark's timings of them include those spills; routed only where they measured fastest)
        slack = 64 if cfg.label() in cuda_step.SPILL_AT_CAP_SHAPES else 8
        assert "LOCAL:0" in lines[0] and (stack == 0 or (stack <= slack and regs >= cap)), \
            f"NVRTC {_cudart.nvrtc_version()}, {cfg} {defs}: {lines[0].strip()}"
        assert regs * cfg.threads() * min(cfg.min_blocks, 2048 // cfg.threads()) <= 65536, (cfg, regs)


def test_params_are_the_kernels_parameter_list():
    """What ``CudaStep`` packs (names, order, kinds) is ``gdn_fused_step``'s signature in step.cu."""
    src = cuda_step.source()
    m = re.search(r"gdn_fused_step\((.*?)\)\s*\{", src, re.S)
    assert m
    kinds = {"void*": "p", "float": "f", "int": "i", "i64": "q"}
    params = []
    for decl in m.group(1).split(","):
        decl = " ".join(decl.replace("__restrict__", "").replace("const ", "").split())
        typ, name = decl.rsplit(" ", 1)
        if name.startswith("*"):
            typ, name = typ + "*", name[1:]
        params.append((name, kinds[typ.replace(" ", "")]))
    assert tuple(params) == cuda_step.PARAMS
    assert cuda_step.SIG == "".join(k for _, k in params)


def test_scalar_values_put_each_stride_where_the_kernel_reads_it():
    """A layout with every stride distinct: the value of each named parameter is that tensor's stride."""
    tok, width = 6, 2 * H * K + HV * V
    proj = torch.empty(tok, width + HV * V + 7)
    mixed = proj[:, :width]
    gate = proj[:, width:width + HV * V].view(tok, HV, V)
    ba = torch.empty(tok, 2 * HV + 3)
    b, a = ba[:, :HV], ba[:, HV:2 * HV]
    out = torch.empty(tok, HV, V)
    state = torch.empty(11, HV, V, K)[::2]
    idx = torch.empty(3, 5, dtype=torch.int32)[:, :2]
    vals = dict(zip((n for n, _ in cuda_step.PARAMS),
                    cuda_step.scalar_values(mixed, a, b, out, state, idx, gate, scale=0.25, norm_eps=1e-6, cols=2)))
    assert all(vals[n] == 0 for n, k in cuda_step.PARAMS if k == "p")
    assert vals["scale"] == 0.25 and vals["norm_eps"] == 1e-6 and vals["cols"] == 2
    assert vals["s_x_tok"] == width + HV * V + 7 and vals["s_z_tok"] == width + HV * V + 7 and vals["s_z_head"] == V
    assert vals["s_a_tok"] == vals["s_b_tok"] == 2 * HV + 3
    assert vals["s_o_tok"] == HV * V and vals["s_state_slot"] == 2 * HV * V * K
    assert vals["s_idx_seq"] == 5 and vals["s_idx_tok"] == 1
    one = cuda_step.scalar_values(mixed, a, b, out, state, idx[:, 0], gate, scale=0.25, norm_eps=1e-6, cols=1)
    assert one[-3:-1] == [5, 1]  # a 1-D index tensor (the packed decode): its stride, column stride 1
    assert vals["n_items"] == 0 and cuda_step.scalar_values(mixed, a, b, out, state, idx, gate, scale=0.25,
                                                            norm_eps=1e-6, cols=2, n_items=96)[-1] == 96


def test_shared_tile_shapes_parse_and_refuse_what_they_cannot_take():
    """The labels' ``b`` suffix round-trips into the TILE_SMEM build; a tile in shared memory needs one CTA per
    head and a tile of at most MAX_SMEM_TILE bytes; the register-tile shapes' defines are as before."""
    for label in cuda_step.SMEM_TILE_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.bulk
        assert cuda_step.config_why(K, V, torch.float32, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["TILE_SMEM"] == 1
    assert not cuda_step.CudaConfig.parse("128x8x4t256m2").bulk
    assert "one CTA per head" in cuda_step.config_why(K, V, BF, cuda_step.CudaConfig.parse("64x8x1t128m8b"))
    assert "state tile in shared memory" in cuda_step.config_why(256, 256, torch.float32,
                                                                 cuda_step.CudaConfig.parse("256x16x2t512m2b"))
    assert cuda_step.config_why(256, 256, BF, cuda_step.CudaConfig.parse("256x16x2t512m2b")) is None  # 128 KiB
    for bad in ("128x8x4t256m2p", "128x8x4t256m2bs"):
        with pytest.raises(ValueError):
            cuda_step.CudaConfig.parse(bad)
    assert cuda_step.tile_bytes(torch.empty(2, HV, V, K, dtype=BF)) == V * K * 2
    assert "TILE_SMEM" not in cuda_step.defines(H, HV, K, V, cuda_step.CudaConfig(), spec=True, tm=4, kinds={})

def test_chain_shapes_parse_and_refuse_what_they_cannot_take():
    """The labels' ``c`` suffix round-trips into the SHORT_CHAIN build (the register tile in one pass, or with
    ``b`` the tile in shared memory at any passes); a register tile of several passes is refused; the other
    shapes' defines are as before."""
    for label in cuda_step.CHAIN_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.chain
        assert cuda_step.config_why(K, V, torch.float32, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["SHORT_CHAIN"] == 1
    assert cuda_step.CudaConfig.parse("128x8x4t256m2sc").stream
    assert "4 passes" in cuda_step.config_why(K, V, BF, cuda_step.CudaConfig.parse("128x8x2t128m4c"))
    # with the tile in shared memory the short chain is the prologue's only: any number of passes
    assert cuda_step.config_why(K, V, BF, cuda_step.CudaConfig.parse("128x8x2t256m4cb")) is None
    with pytest.raises(ValueError):
        cuda_step.CudaConfig.parse("128x8x4t256m2bc")
    for label in cuda_step.CHAIN_TILE_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.chain and cfg.bulk and cuda_step.config_why(K, V, BF, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["SHORT_CHAIN"] == 1
    for label in cuda_step.SMEM_TILE_SHAPES + ("128x8x4t256m2", "16x8x1t128m8"):
        assert "SHORT_CHAIN" not in cuda_step.defines(H, HV, K, V, cuda_step.CudaConfig.parse(label), spec=True,
                                                      tm=4, kinds={})


def test_async_norm_shapes_parse_and_refuse_what_they_cannot_take():
    """The labels' ``a`` suffix round-trips into the NORM_ASYNC build, for clusters only (more than one CTA per
    head); the other shapes' defines are as before."""
    for label in cuda_step.ASYNC_NORM_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.norm_async and cfg.block_v < V
        assert cuda_step.config_why(K, V, BF, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["NORM_ASYNC"] == 1
    assert "one CTA per head" in cuda_step.config_why(K, V, BF, cuda_step.CudaConfig.parse("128x8x4t256m2ca"))
    with pytest.raises(ValueError):
        cuda_step.CudaConfig.parse("64x8x4t128m4ac")
    for label in cuda_step.SMEM_TILE_SHAPES + cuda_step.CHAIN_SHAPES + ("64x8x1t128m8",):
        assert "NORM_ASYNC" not in cuda_step.defines(H, HV, K, V, cuda_step.CudaConfig.parse(label), spec=True,
                                                     tm=4, kinds={})


def test_guess_shapes_parse_and_refuse_what_they_cannot_take():
    """The labels' ``g`` suffix round-trips into GUESS_ROWS for the MTP call only (the packed decode's rows are
    known at launch), with the short chain only; the other shapes' defines are as before."""
    for label in cuda_step.GUESS_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.guess and cfg.chain
        assert cuda_step.config_why(K, V, BF, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["GUESS_ROWS"] == 1
        assert "GUESS_ROWS" not in cuda_step.defines(H, HV, K, V, cfg, spec=False, tm=1, kinds={})
    assert "without the short load chain" in cuda_step.config_why(K, V, BF, cuda_step.CudaConfig.parse("128x8x2t256m4bg"))
    with pytest.raises(ValueError):
        cuda_step.CudaConfig.parse("64x8x4t128m4cga")
    for label in cuda_step.ASYNC_NORM_SHAPES + cuda_step.CHAIN_TILE_SHAPES:
        assert "GUESS_ROWS" not in cuda_step.defines(H, HV, K, V, cuda_step.CudaConfig.parse(label), spec=True,
                                                     tm=4, kinds={})


def test_scatter_shapes_parse_and_build_only_with_it():
    """The labels' ``x`` suffix round-trips into SCATTER_SUMS (any launch shape: the row sums' reduce-scatter is in the
    passes); it is the last suffix, and the other shapes' defines are as before (their cubin keys unchanged)."""
    for label in cuda_step.SCATTER_SHAPES:
        cfg = cuda_step.CudaConfig.parse(label)
        assert cfg.label() == label and cfg.scatter
        assert cuda_step.config_why(K, V, BF, cfg) is None
        assert cuda_step.defines(H, HV, K, V, cfg, spec=True, tm=4, kinds={})["SCATTER_SUMS"] == 1
        twin = cuda_step.CudaConfig.parse(label[:-1])
        assert not twin.scatter and twin.label() == label[:-1]
    with pytest.raises(ValueError):
        cuda_step.CudaConfig.parse("64x8x4t128m4cxg")
    for label in cuda_step.ASYNC_NORM_SHAPES + cuda_step.CHAIN_TILE_SHAPES + cuda_step.GUESS_SHAPES:
        assert "SCATTER_SUMS" not in cuda_step.defines(H, HV, K, V, cuda_step.CudaConfig.parse(label), spec=True,
                                                       tm=4, kinds={})


def test_refusals_say_why():
    pool = torch.zeros(4, HV, V, K)
    t = {"a": torch.zeros(2, HV, dtype=BF), "b": torch.zeros(2, HV, dtype=BF)}
    assert "not a CUDA device" in cuda_step.why_not(pool, t, cuda_step.CudaConfig())
    assert cuda_step.config_why(K, V, torch.float32, cuda_step.CudaConfig(block_v=8, nthreads=64)) == (
        "V = 128 with 8 rows per CTA, 64 threads and 1 rows per thread")  # 16 CTAs a head: more than a cluster
    assert "24 threads" in cuda_step.config_why(K, V, torch.float32, cuda_step.CudaConfig(nthreads=24))
    assert "96 threads" in cuda_step.config_why(K, V, torch.float32, cuda_step.CudaConfig(nthreads=96))  # 12 rows
    assert "lanes per row" in cuda_step.config_why(K, V, torch.float32, cuda_step.CudaConfig(lanes=64))
    assert "K = 96" in cuda_step.config_why(96, V, torch.bfloat16, cuda_step.CudaConfig(lanes=8))
    assert "state values per thread" in cuda_step.config_why(256, V, torch.float32,
                                                             cuda_step.CudaConfig(lanes=4, rows=1))
    for dt in (torch.float32, BF):
        for n in routing.BATCHES:
            for tt in routing.TS:
                assert cuda_step.config_why(K, V, dt, cuda_step.pick_config(n, HV, V, K, dt, tt)) is None


def test_both_gdn_kernels_take_the_state_row_header_from_one_file_and_nvrtc_names_its_lines(tmp_path):
    """step.cu and replay.cu include rows.cuh (the state rows, the reductions, the delta-rule pass): the source
    each compiles is that header expanded in place, once, between #line directives, so that an error in the
    header or after it is reported at its own file and line; and the canary's kernel hash covers the header."""
    from sndr.kernels.gdn import canary, replay

    header = (cuda_step.SOURCE.parent / "rows.cuh").read_text()
    for name, src in (("step.cu", cuda_step.source()), ("replay.cu", replay.cuda_source())):
        assert src.count(header) == 1 and '#include "rows.cuh"' not in src, name
        assert '#line 1 "rows.cuh"' in src and f'"{name}"' in src, name
    # the expansion: once per file, line numbers of the includer kept after it
    (tmp_path / "h.cuh").write_text("int h;\n")
    (tmp_path / "k.cu").write_text('// one\n#include "h.cuh"\n#include "h.cuh"\nint bad_here\n')
    src = _cudart.read_source(tmp_path / "k.cu")
    assert src == '// one\n#line 1 "h.cuh"\nint h;\n\n#line 3 "k.cu"\n\nint bad_here\n'
    _nvrtc_or_skip()
    with pytest.raises(_cudart.CudaError) as err:  # two host variables: an error in each file, at its own line
        _cudart.compile_cubin(src, "k", "90", {}, cache=False)
    assert "h.cuh(1): error" in str(err.value) and "k.cu(4): error" in str(err.value), str(err.value)
    # the canary's kernel hash covers the header (a change to it is a new kernel, to be checked again)
    from sndr.kernels import canary as _canary

    here = cuda_step.SOURCE.parent
    assert canary.kernel_hash() != _canary.source_hash(p for p in here.iterdir() if p.suffix in (".py", ".cu"))
