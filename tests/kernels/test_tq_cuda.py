"""The CUDA backend of the TurboQuant k8v4 decode, on a machine without a GPU.

* The shipped CUDA source compiles with NVRTC for sm_90 (page and warp
  kernels) and sm_89 (warp kernel) across the supported shapes, with no
  local-memory spills (NVRTC from the ``nvidia-cuda-nvrtc`` wheel; the test
  extra installs it on Linux x86_64, elsewhere these tests skip with the reason).
* The launch-shape arithmetic (row pitch, split count) and the call checks
  that decide between CUDA and Triton, and the fallback when the CUDA path
  fails. Numerical correctness runs on a GPU: ``test_tq_cuda_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_mtp_verify import _cuobjdump, _nvrtc_or_skip  # noqa: E402  (one home for the cubin tools)

from sndr import env  # noqa: E402
from sndr.kernels import _cudart  # noqa: E402
from sndr.kernels.turboquant_k8v4 import cuda_decode, dispatch, kernels  # noqa: E402
from sndr.kernels.turboquant_k8v4._layout import Layout  # noqa: E402


class _Fake:
    """Shapes and strides of a tensor without memory (for the build defines)."""

    def __init__(self, shape, stride, dtype=torch.uint8, ptr=0):
        self.shape, self._stride, self.dtype, self._ptr = tuple(shape), tuple(stride), dtype, ptr

    def stride(self, i=None):
        return self._stride if i is None else self._stride[i]

    def data_ptr(self):
        return self._ptr


def _shape(d: int, hk: int, g: int, page: int = 16, bf16: bool = True):
    slot = Layout(d).slot_size_aligned
    cache = _Fake((100, page, hk, slot), (page * hk * slot, hk * slot, slot, 1))
    q = _Fake((4, hk * g, d), (hk * g * d, d, 1), torch.bfloat16 if bf16 else torch.float16)
    return q, cache


# (head dim, Hk, G, page, bf16): row-copy and single-copy page kernels, one and
# two n-tiles of heads, fp16 and bf16 queries
SHAPES = [
    (128, 8, 4, 16, True), (128, 8, 8, 16, False), (128, 4, 6, 32, True), (128, 2, 16, 16, True),
    (128, 1, 8, 64, False), (128, 16, 2, 16, True), (128, 8, 16, 16, True), (64, 4, 8, 16, True), (64, 2, 12, 16, False),
    (256, 8, 4, 16, True), (256, 2, 8, 16, False), (256, 4, 16, 32, True),
]


@pytest.mark.parametrize("d,hk,g,page,bf16", SHAPES)
def test_cuda_source_compiles_without_spills(d, hk, g, page, bf16, tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    q, cache = _shape(d, hk, g, page, bf16)
    src = cuda_decode.SOURCE_PATH.read_text()
    builds = [("90", cuda_decode.DEFAULT), ("90", dataclasses.replace(cuda_decode.DEFAULT, cluster=8)),
              ("90", dataclasses.replace(cuda_decode.DEFAULT, grid_merge=True, evict_first=True))]
    if d <= 128:  # head dim 256 runs the page kernel only
        builds += [("90", cuda_decode.CudaConfig(kind="warp")), ("89", cuda_decode.CudaConfig(kind="warp"))]
    tool = _cuobjdump()
    for arch, cfg in builds:
        cubin = _cudart.compile_cubin(src, cuda_decode.KERNELS[cfg.kind], arch, cuda_decode.defines(q, cache, cfg))
        assert cubin[:4] == b"\x7fELF"
        if tool:
            f = tmp_path / f"k{arch}{cfg.kind}.cubin"
            f.write_bytes(cubin)
            usage = subprocess.run([tool, "--dump-resource-usage", str(f)], capture_output=True, text=True).stdout
            lines = [ln for ln in usage.splitlines() if "REG:" in ln]
            assert len(lines) >= 2  # the split kernel and the merge kernel
            for line in lines:
                assert "LOCAL:0" in line and "STACK:0" in line, f"sm_{arch} {cfg.kind}: {line.strip()}"


def test_compile_error_names_the_file_and_line(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    with pytest.raises(_cudart.CudaError, match=r"broken\.cu\(2\): error"):
        _cudart.compile_cubin('extern "C" __global__ void broken() {\n  undefined_thing();\n}\n',
                              "broken", "90", {})


def test_cubin_cache_is_keyed_by_source_and_defines(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(int* p) { p[0] = V; }\n'
    monkeypatch.setattr(_cudart, "_CUBIN_DIRS", {})
    a = _cudart.compile_cubin(src, "k", "90", {"V": 1})
    files = sorted(f for f in (tmp_path / "cubin").iterdir() if f.name != ".secret")
    # sealed: a 32-byte HMAC under cubin/.secret, then the cubin (tests/reliability/test_trust_boundaries.py)
    assert len(files) == 1 and files[0].read_bytes()[32:] == a
    assert _cudart.compile_cubin(src, "k", "90", {"V": 1}) == a  # from the cache
    _cudart.compile_cubin(src, "k", "90", {"V": 2})
    assert len([f for f in (tmp_path / "cubin").iterdir() if f.name != ".secret"]) == 2


def test_missing_nvrtc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_cudart, "_NVRTC", [])
    monkeypatch.setattr(_cudart, "_nvrtc_candidates", lambda: ["/nonexistent/libnvrtc.so.99"])
    with pytest.raises(_cudart.CudaUnavailable, match="/nonexistent/libnvrtc.so.99"):
        _cudart.nvrtc_version()


def test_sndr_nvrtc_env_is_tried_first(monkeypatch):
    monkeypatch.setenv("SNDR_NVRTC", "/opt/x/libnvrtc.so.13")
    assert _cudart._nvrtc_candidates()[0] == "/opt/x/libnvrtc.so.13"


@pytest.mark.parametrize("sp", [196, 392, 784, 1568, 3136, 400, 800, 1600])
def test_row_pitch(sp):
    pitch, rowcopy = cuda_decode.row_pitch(sp)
    if sp % 16:
        assert (pitch, rowcopy) == (sp, 0)  # one TMA copy of the whole tile
        return
    assert rowcopy == 1 and pitch % 16 == 0 and sp <= pitch < sp + 64
    words = pitch // 4
    # key reads: lanes (g, t4) read word g * words + t4 (+ const): 32 distinct banks
    assert len({(g * words + t4) % 32 for g in range(8) for t4 in range(4)}) == 32
    # value reads: tokens 2 t4 (+1), word g (+8u): 32 distinct banks
    assert len({(2 * t4 * words + g) % 32 for g in range(8) for t4 in range(4)}) == 32


def test_split_count_fills_one_wave_and_depends_on_shape_only():
    sms, wps = 132, 16
    slots = sms * wps
    for bh in (8, 32, 64, 256, 512, 2048):
        s = cuda_decode.num_splits(bh, wps, sms, 128, 1)
        assert 1 <= s <= 128
        if slots // bh <= 128:
            assert s == max(1, slots // bh)
    # capped: the count whose last wave is fullest
    s = cuda_decode.num_splits(8, wps, sms, 32, 1)
    assert s == 32
    s = cuda_decode.num_splits(64, 12, 132, 20, 2)
    waves = lambda n: 64 * n / (-(-64 * n // (12 * 132)) * (12 * 132))  # noqa: E731
    assert all(waves(s) >= waves(n) for n in range(1, 21))


def _cpu_call(d=128, hk=8, g=4, page=16, qdtype=torch.bfloat16):
    lay = Layout(d)
    q = torch.zeros(2, hk * g, d, dtype=qdtype)
    cache = torch.zeros(6, page, hk, lay.slot_size_aligned, dtype=torch.uint8)
    bt = torch.zeros(2, 3, dtype=torch.int32)
    sl = torch.tensor([5, 40], dtype=torch.int32)
    return q, cache, bt, sl


def test_shape_checks_accept_the_vllm_layout_and_name_what_they_refuse():
    q, cache, bt, sl = _cpu_call()
    assert cuda_decode.shape_problem(q, cache, bt, sl) is None
    assert cuda_decode.shape_problem(*_cpu_call(d=256)) is None  # the page kernel takes it
    assert "head dim 96" in cuda_decode.shape_problem(*_cpu_call(d=96))
    assert "group size" in cuda_decode.shape_problem(*_cpu_call(g=32))
    assert "page size 8" in cuda_decode.shape_problem(*_cpu_call(page=8))
    assert "query dtype" in cuda_decode.shape_problem(*_cpu_call(qdtype=torch.float32))
    assert "block table" in cuda_decode.shape_problem(q, cache, bt.long(), sl)
    assert "seq_lens" in cuda_decode.shape_problem(q, cache, bt, sl.long())
    odd = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # 2-byte aligned rows
    assert "query rows" in cuda_decode.shape_problem(odd, cache, bt, sl)
    assert cuda_decode.unsupported(q, cache, bt, sl) == "not a CUDA device"


def test_page_kernel_needs_whole_rows_in_a_16_byte_aligned_cache(monkeypatch):
    monkeypatch.setattr(cuda_decode, "_capability", lambda idx: (9, 0))
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 0)
    _, cache, _, _ = _cpu_call()
    assert cuda_decode.page_kind_ok(cache) == (cache.data_ptr() % 16 == 0)
    # heads interleaved with another tensor's rows: the row copy would not cover them
    wide = torch.zeros(6, 16, 8, 2 * 196, dtype=torch.uint8)[..., :196]
    assert not cuda_decode.page_kind_ok(wide.as_strided(wide.shape, (16 * 196, 196, 16 * 196 * 6, 1)))
    monkeypatch.setattr(cuda_decode, "_capability", lambda idx: (8, 9))  # no TMA bulk copies
    assert not cuda_decode.page_kind_ok(cache)
    assert cuda_decode.resolve(cuda_decode.DEFAULT, cache).kind == "warp"


def test_backend_env(monkeypatch):
    monkeypatch.delenv("SNDR_TQ_BACKEND", raising=False)
    assert env.tq_backend() == "auto"
    monkeypatch.setenv("SNDR_TQ_BACKEND", " Triton ")
    assert env.tq_backend() == "triton"
    monkeypatch.setenv("SNDR_TQ_BACKEND", "fast")
    with pytest.raises(ValueError, match="SNDR_TQ_BACKEND='fast'"):
        env.tq_backend()


def test_cuda_failure_falls_back_to_triton_once_and_loudly(monkeypatch, caplog):
    q, cache, bt, sl = _cpu_call()
    monkeypatch.delenv("SNDR_TQ_BACKEND", raising=False)
    monkeypatch.setattr(cuda_decode, "unsupported", lambda *a: cuda_decode._BROKEN.get(7))
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 7)
    monkeypatch.setattr(cuda_decode, "_BROKEN", {})

    def boom(*a, **k):
        raise _cudart.CudaUnavailable("libnvrtc not found (tried: x)")

    monkeypatch.setattr(cuda_decode, "decode_attention", boom)
    with caplog.at_level(logging.WARNING, logger="sndr.kernels"):
        assert dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32) is None
        assert dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32) is None
    assert cuda_decode._BROKEN == {7: "libnvrtc not found (tried: x)"}
    msgs = [r.getMessage() for r in caplog.records if "TurboQuant CUDA decode disabled" in r.getMessage()]
    assert len(msgs) == 1 and "cuda:7" in msgs[0]
    # SNDR_TQ_BACKEND=cuda: the failure is raised, not hidden
    monkeypatch.setattr(cuda_decode, "_BROKEN", {})
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")
    with pytest.raises(_cudart.CudaUnavailable):
        dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32)


def test_triton_backend_env_skips_cuda(monkeypatch):
    q, cache, bt, sl = _cpu_call()
    monkeypatch.setenv("SNDR_TQ_BACKEND", "triton")
    monkeypatch.setattr(cuda_decode, "decode_attention", lambda *a, **k: pytest.fail("CUDA path taken"))
    assert dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32) is None


def test_every_kernel_python_launches_is_defined_in_the_source():
    import re

    text = cuda_decode.SOURCE_PATH.read_text()
    defined = set(re.findall(r'extern "C" __global__ void (?:__cluster_dims__\([^)]*\) )?__launch_bounds__\([^)]*\)\s+'
                             r'(\w+)\(', text))
    assert defined == set(cuda_decode.KERNELS.values()) | {cuda_decode.MERGE, cuda_decode.MERGED, cuda_decode.CLUSTERED,
                                                           cuda_decode.GRID, cuda_decode.MERGE_ROWS}


def test_first_call_inside_a_graph_capture_records_triton(monkeypatch):
    q, cache, bt, sl = _cpu_call()
    monkeypatch.delenv("SNDR_TQ_BACKEND", raising=False)
    monkeypatch.setattr(cuda_decode, "unsupported", lambda *a: None)
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 0)
    monkeypatch.setattr(dispatch, "_capturing", lambda: True)
    monkeypatch.setattr(cuda_decode, "decode_attention", lambda *a, **k: pytest.fail("built inside a capture"))
    monkeypatch.setattr(cuda_decode, "_PLANS", {})
    assert dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32) is None
    assert cuda_decode._BROKEN == {}  # not disabled: the next eager call builds it
    monkeypatch.setenv("SNDR_TQ_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="run it once eagerly"):
        dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32)
    # once built (by an eager call), captures use it
    monkeypatch.setitem(cuda_decode._PLANS, cuda_decode._plan_key(q, cache, cuda_decode.DEFAULT), ("cfg", "k", 16))
    monkeypatch.setattr(cuda_decode, "decode_attention", lambda *a, **k: "cuda")
    assert dispatch._try_cuda(q, cache, bt, sl, 0.1, None, None, None, 32) == "cuda"


def test_kernels_and_cuda_decode_do_not_import_each_other():
    import ast

    pkg = cuda_decode.SOURCE_PATH.parent

    def imports(name):
        tree = ast.parse((pkg / f"{name}.py").read_text())
        top = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 for a in n.names}
        top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
        return top

    assert not {"cuda_decode", "dispatch"} & imports("kernels")
    assert not {"kernels", "dispatch"} & imports("cuda_decode")
    # the package's public name is dispatch's (kernels holds the Triton backend only, no forward)
    assert not hasattr(kernels, "decode_attention")
    from sndr.kernels import turboquant_k8v4 as tq

    assert tq.decode_attention is dispatch.decode_attention


class _FakeKernel:
    name, smem = "k", 1234

    class func:  # noqa: N801
        value = 0xABC0


def test_launch_packs_arguments_and_config_once():
    import ctypes
    import struct

    values = [0x1000, 0x2000, 0.5, 7, -3, 1 << 40]
    la = _cudart.Launch(_FakeKernel, 99, 256, "ppfiqq", values, pdl=True)
    assert [la.offset(i) for i in range(6)] == [0, 8, 16, 20, 24, 32]  # natural alignment
    ptrs = ctypes.cast(la.params, ctypes.POINTER(ctypes.c_void_p))
    base = ptrs[0]
    assert [ptrs[i] - base for i in range(6)] == [0, 8, 16, 20, 24, 32]
    assert struct.unpack_from("<QQfiqq", la.args, 0) == tuple(values)
    assert ctypes.string_at(base, 40) == bytes(la.args[:40])  # params point into the packed buffer
    grid, gy, gz, blk, by, bz, smem, stream, attrs, nattr = struct.unpack_from("<7I4xQQI4x", la.cfg, 0)
    assert (grid, gy, gz, blk, by, bz, smem, nattr) == (99, 1, 1, 256, 1, 1, 1234, 1)
    assert struct.unpack_from("<I4xi", ctypes.string_at(attrs, 12)) == (6, 1)  # programmatic serialization
    la.set(0, 0x3000)
    assert struct.unpack_from("<Q", la.args, 0)[0] == 0x3000
    plain = _cudart.Launch(_FakeKernel, 1, 32, "p", [0])
    assert struct.unpack_from("<7I4xQQI4x", plain.cfg, 0)[-1] == 0  # no attributes


class _FakeModuleKernel:
    """A page-kernel build's kernels without a GPU (what LaunchPlan reads of them)."""

    def __init__(self, name="tq_k8v4_decode_page", smem=76 * 1024):
        self.name, self.smem = name, smem
        self.func = _FakeKernel.func
        self.module = self

    def kernel(self, name, smem=0):
        return _FakeModuleKernel(name, smem)

    def blocks_per_sm(self, block_threads):
        return 2


@pytest.mark.parametrize("bsz,cl,want_splits,want_mode", [
    (8, 4, 32, "cluster"),   # 33 splits fill one wave: whole clusters of 4 -> 32
    (8, 8, 32, "cluster"),
    (5, 8, 48, "cluster"),   # 52 -> 48
    (64, 8, 4, "triton"),    # 4 splits hold no cluster of 8: the plain kernel and MERGE_POLICY
    (64, 4, 4, "cluster"),
])
def test_cluster_plan_rounds_splits_to_whole_clusters(bsz, cl, want_splits, want_mode, monkeypatch):
    cfg = dataclasses.replace(cuda_decode.DEFAULT, cluster=cl)
    monkeypatch.setattr(cuda_decode, "kernel_plan", lambda q, c, conf: (conf, _FakeModuleKernel(), 16))
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 0)
    monkeypatch.setattr(cuda_decode, "_sm_count", lambda idx: 132)
    monkeypatch.setattr(cuda_decode, "_capability", lambda idx: (9, 0))
    q = torch.zeros(bsz, 32, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 8, Layout(128).slot_size_aligned, dtype=torch.uint8)
    bt = torch.zeros(bsz, 4, dtype=torch.int32)
    lp = cuda_decode.LaunchPlan(q, cache, bt, torch.bfloat16, (32 * 128, 128), 32, 32, cfg)
    assert lp.splits == want_splits and lp.mode(False) in (want_mode, "cuda") and lp.mode(True) == want_mode
    if want_mode == "cluster":
        assert lp.clustered is not None and lp.clustered.grid == bsz * want_splits
        assert lp.clustered.kernel.name == cuda_decode.CLUSTERED and lp.clustered.kernel.smem == 76 * 1024
        assert lp.split.args[lp.split.offset(10):lp.split.offset(10) + 4] == want_splits.to_bytes(4, "little")
    # no cluster kernel where the merge is not CUDA's (an output dtype it does not write)
    plain = cuda_decode.LaunchPlan(q, cache, bt, torch.float64, None, None, 32, cfg)
    assert plain.clustered is None and plain.mode(True) == "triton"


@pytest.mark.parametrize("bsz,hk,blocks_per_sm,want", [
    (8, 8, 2, "grid"),     # 33 splits x 8 = 264 blocks: one wave of 2 blocks on 132 SMs
    (64, 8, 2, "grid"),
    (8, 8, 1, "triton"),   # the grid kernel fits one block per SM: 264 blocks are two waves, no cooperative launch
    (8, 4, 2, "triton"),   # 4 KV-head warps per block: not merge_block's 8
])
def test_grid_merge_plan_needs_one_wave_of_8_warp_blocks(bsz, hk, blocks_per_sm, want, monkeypatch):
    import struct

    cfg = dataclasses.replace(cuda_decode.DEFAULT, grid_merge=True)

    class Grid(_FakeModuleKernel):
        def kernel(self, name, smem=0):
            k = Grid(name, smem)
            if name == cuda_decode.GRID:
                k.blocks_per_sm = lambda threads: blocks_per_sm
            return k

    monkeypatch.setattr(cuda_decode, "kernel_plan", lambda q, c, conf: (conf, Grid(), 16))
    monkeypatch.setattr(cuda_decode, "device_index", lambda t: 0)
    monkeypatch.setattr(cuda_decode, "_sm_count", lambda idx: 132)
    monkeypatch.setattr(cuda_decode, "_capability", lambda idx: (9, 0))
    q = torch.zeros(bsz, hk * 4, 128, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, hk, Layout(128).slot_size_aligned, dtype=torch.uint8)
    bt = torch.zeros(bsz, 4, dtype=torch.int32)
    lp = cuda_decode.LaunchPlan(q, cache, bt, torch.bfloat16, (hk * 4 * 128, 128), 32, 32, cfg)
    assert lp.mode(True) == want
    if want == "grid":
        assert lp.gridded is not None and lp.gridded.kernel.name == cuda_decode.GRID
        grid, _, _, _, _, _, _, _, attrs, nattr = struct.unpack_from("<7I4xQQI4x", lp.gridded.cfg, 0)
        import ctypes

        assert grid == bsz * lp.splits and nattr == 1
        assert struct.unpack_from("<I4xi", ctypes.string_at(attrs, 12)) == (2, 1)  # cooperative


def test_device_facts_are_asked_of_torch_once_per_device(monkeypatch):
    """_cudart is the one home of the kernels' device facts (cuda_decode, mtp_verify and kernels.py take them
    from it): the capability and the multiprocessor count are asked of torch once per device and process, and
    a tensor's or a torch.device's index without one is torch's current device."""
    from sndr.kernels.turboquant_k8v4 import mtp_verify

    calls = []
    monkeypatch.setattr(_cudart, "_CAPABILITY", {})
    monkeypatch.setattr(_cudart, "_SM_COUNT", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx: calls.append(("cap", idx)) or (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda idx: calls.append(("props", idx)) or types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for _ in range(3):
        assert cuda_decode._capability(1) == mtp_verify._capability(1) == (9, 0)
        assert cuda_decode._sm_count(1) == mtp_verify._sm_count(1) == 132
    assert kernels._sm_count(torch.device("cuda", 1)) == 132 and kernels._sm_count(torch.device("cpu")) == 8
    assert calls == [("cap", 1), ("props", 1)]
    assert _cudart.device_index(torch.device("cuda")) == 3 and _cudart.device_index(torch.device("cuda", 2)) == 2
    assert cuda_decode.device_index(torch.empty(1)) == 3  # a CPU tensor has no index either
    assert mtp_verify._device_index is _cudart.device_index
