"""PK0002: uniform spec-verify batches of vLLM 0.32.0's TurboQuant backend as decodes.

Three parts:

* the patch file: both runtime targets bind (signature and source hash) in the
  pinned 0.32.0 tree and in 0.33.0 with the shipped set applied, and the patch
  is experimental, off by default, and needs PG0001 (whose forward it pins);
* on the CPU install of vLLM 0.32.0 (``vllm_install``): the wrappers installed
  by sndr's RuntimePatcher from the TOML on the real classes, before vLLM
  imports them; the builder marks exactly the uniform K + 1 batches with no
  prompt prefill and returns every other batch as vLLM built it; the forward
  sends a marked batch to ``mtp_verify`` (here the synthetic-rows fallback
  under Triton's interpreter) and matches K + 1 separate float64 decodes;
* the harness (``gpu``): vLLM 0.32.0's own ``turboquant_attn.py`` with the
  shipped set applied, copied into the ignored ``.baselines/vllm032_tq_attn``
  (``python3 -m tests.patches.test_mtp_routing --make-baselines``), executed
  with small stand-ins for the vLLM modules it imports and vLLM's real
  TurboQuant kernels (``.baselines/vllm032_tq``); a uniform K + 1 batch through
  the unpatched forward (vLLM's per-request loop) and through the PK0002 forward
  (sndr's verify kernel) agree within bf16 tolerance, and a non-uniform batch
  gives byte-identical outputs either way. Skips without a GPU or the copies.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from sndr.binding import find_binding

from .conftest import ok, run_cases

REPO = Path(__file__).resolve().parents[2]
ATTN_DIR = REPO / ".baselines" / "vllm032_tq_attn"
TQ_ATTN = "vllm/v1/attention/backends/turboquant_attn.py"


PATCH_FILE = REPO / "patches" / "PK0002-turboquant-mtp-verify.toml"


def load_patch_set(**kw):
    from sndr.load import load_patch_set as load  # pydantic: not on the GPU host, where the harness runs

    return load(**kw)


def _patch():
    return next(p for p in load_patch_set(packs=False).patches if p.id == "PK0002")


def _specs():
    """The runtime edits as the startup hook hands them to the RuntimePatcher (read with tomllib alone)."""
    import tomllib

    data = tomllib.loads(PATCH_FILE.read_text())
    return [dict({"required": True, "chain": False, "wrap": False, "description": ""}, **r, patch=data["id"],
                 allowed=["sndr"]) for r in data["runtime"]]


# ----------------------------------------------------------------------------- the patch file


def test_patch_is_active_default_on_and_needs_pg0001():
    p = _patch()
    assert (p.kind, p.lifecycle, p.default, p.requires) == ("plugin", "active", True, ["PG0001"])
    assert {r.target.rsplit(":", 1)[1] for r in p.runtime} == {"TurboQuantMetadataBuilder.build",
                                                               "TurboQuantAttentionImpl.forward"}
    assert all(r.wrap and r.required and r.signature and r.source_sha256 for r in p.runtime)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_targets_bind_after_the_shipped_set(version, tmp_path, vllm_root):
    from sndr.apply import run_apply

    root = tmp_path / "site"
    shutil.copytree(vllm_root(version), root, ignore=shutil.ignore_patterns(".complete"))
    report = run_apply(root, load_patch_set(packs=False), environ={"SNDR_ENABLE_PK0002": "1"}, only=["PK0002"])
    res = next(r for r in report.patches if r.id == "PK0002")
    # a runtime-only set writes nothing on disk: its bindings hold (applies), each vLLM process installs them
    assert res.status == "applies" and {e.verdict.value for e in res.edits} == {"applies"}, \
        [(e.name, e.verdict, e.reason) for e in res.edits]
    text = (root / TQ_ATTN).read_text()
    for r in _patch().runtime:
        b = find_binding(text, r.target.split(":", 1)[1])
        assert (b.signature, b.source_sha256) == (r.signature, r.source_sha256)


def test_build_is_pristine_and_forward_is_pg0001s(vllm_pin_root):
    pristine = (vllm_pin_root / TQ_ATTN).read_text()
    build, forward = sorted(_patch().runtime, key=lambda r: r.name)
    assert find_binding(pristine, "TurboQuantMetadataBuilder.build").source_sha256 == build.source_sha256
    assert find_binding(pristine, "TurboQuantAttentionImpl.forward").source_sha256 != forward.source_sha256


# ----------------------------------------------------------------------------- CPU install of vLLM

INSTALLED = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
from types import SimpleNamespace
from sndr.load import load_patch_set
from sndr.startup.runtime import RuntimePatcher

assert not any(m.startswith("vllm") for m in sys.modules)
ps = load_patch_set(packs=False)
specs = [dict(r.model_dump(mode="json"), patch=p.id, allowed=["sndr"])
         for p in ps.patches if p.id == "PK0002" for r in p.runtime]
patcher = RuntimePatcher()
first = [(o.key, o.verdict, o.reason) for o in patcher.apply(specs)]

import torch
import vllm.v1.attention.backends.turboquant_attn as tq
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
from sndr.runtime_patches import mtp
from sndr.kernels.turboquant_k8v4 import _interp, mtp_verify, reference

_interp.fix_scalar_index()

@case("outcomes")
def _():
    return {"first": first, "now": [(o.key, o.verdict) for o in patcher.outcomes.values()],
            "build_wrapped": getattr(tq.TurboQuantMetadataBuilder.build, "__sndr_wraps__", None) is not None,
            "forward_wrapped": getattr(tq.TurboQuantAttentionImpl.forward, "__sndr_wraps__", None) is not None}

original_build = tq.TurboQuantMetadataBuilder.build.__sndr_wraps__

def builder(ql):
    b = object.__new__(tq.TurboQuantMetadataBuilder)
    b.reorder_batch_threshold = 1
    b.__dict__["_sndr_pk0002_ql"] = ql  # as on a CUDA device with num_speculative_tokens = ql - 1
    return b

def cam(qlens, seq_lens, prefilling=None, padded_tokens=None):
    qsl = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(qlens, dtype=torch.int32).cumsum(0)
    n = int(qsl[-1]) if padded_tokens is None else padded_tokens
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(), query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=len(qlens),
        num_actual_tokens=n, max_query_len=max(qlens), max_seq_len=max(seq_lens),
        block_table_tensor=torch.zeros(len(qlens), 8, dtype=torch.int32), slot_mapping=torch.zeros(n, dtype=torch.int64),
        is_prefilling=None if prefilling is None else torch.tensor(prefilling), seq_lens_cpu_upper_bound=sl.clone())

def summary(md):
    return {"is_prefill": md.is_prefill, "num_decodes": md.num_decodes, "num_decode_tokens": md.num_decode_tokens,
            "mark": getattr(md, mtp.MARK, None)}

def same_as_vllm(b, c):
    a, o = b.build(0, c), original_build(b, 0, c)
    fields = [f for f in a.__dataclass_fields__]
    diff = [f for f in fields if not (getattr(a, f) is getattr(o, f) or getattr(a, f) == getattr(o, f))]
    return {"diff": diff, "marked": hasattr(a, mtp.MARK), "summary": summary(a)}

CASES = {
    "uniform": ([4, 4, 4], [100, 37, 9], None, None),
    "uniform_padded": ([4, 4, 0, 0], [100, 37, 0, 0], None, 16),
    "uniform_not_prefilling": ([4, 4], [100, 37], [False, False], None),
    "prompt_chunk_of_k_plus_1": ([4, 4], [4, 37], [True, False], None),
    "non_uniform": ([4, 2, 4], [100, 37, 9], None, None),
    "mixed_decode_and_verify": ([1, 4], [100, 37], None, None),
    "pure_decode": ([1, 1, 1], [100, 37, 9], None, None),
    "prefill": ([40, 4], [40, 37], [True, False], None),
    "padding_in_the_middle": ([4, 0, 4], [100, 0, 9], None, None),
}
for name, (ql_, sl_, pre, pad) in CASES.items():
    @case("build_" + name)
    def _(ql_=ql_, sl_=sl_, pre=pre, pad=pad):
        return same_as_vllm(builder(4), cam(ql_, sl_, pre, pad))

@case("build_not_applicable")
def _():
    return same_as_vllm(builder(0), cam([4, 4], [100, 37]))

@case("build_for_cudagraph_capture")
def _():
    b = builder(4)
    md = b.build_for_cudagraph_capture(cam([4, 4], [100, 37]))
    return summary(md) | {"seq_lens": md.seq_lens.tolist()}

def cfg(**over):
    base = dict(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                cache_config=SimpleNamespace(cache_dtype="turboquant_k8v4"),
                parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1))
    base.update(over)
    return SimpleNamespace(**base)

@case("applicable")
def _():
    out = {}
    from sndr.kernels import _cudart  # the device facts' one home: the route asks it, torch once per device
    orig = dict(_cudart._CAPABILITY)
    _cudart._CAPABILITY[0] = (9, 0)
    mtp._prepare = lambda *a: None
    mtp._canary = lambda *a: True
    try:
        for name, c, dev in [
            ("mtp3_k8v4_cuda", cfg(), "cuda:0"),
            ("cpu", cfg(), "cpu"),
            ("no_spec", cfg(speculative_config=None), "cuda:0"),
            ("k16", cfg(speculative_config=SimpleNamespace(num_speculative_tokens=16)), "cuda:0"),
            ("mse_preset", cfg(cache_config=SimpleNamespace(cache_dtype="turboquant_4bit_nc")), "cuda:0"),
            ("dcp", cfg(parallel_config=SimpleNamespace(decode_context_parallel_size=2)), "cuda:0"),
        ]:
            b = object.__new__(tq.TurboQuantMetadataBuilder)
            b.vllm_config, b.device = c, torch.device(dev)
            out[name] = mtp.verify_len(b)
        # on by default: the measured capability only; SNDR_ENABLE_PK0002=1 covers sm_89+
        _cudart._CAPABILITY[0] = (8, 9)
        for name, env in [("sm89_default", None), ("sm89_opted_in", "1")]:
            if env is not None:
                os.environ["SNDR_ENABLE_PK0002"] = env
            b = object.__new__(tq.TurboQuantMetadataBuilder)
            b.vllm_config, b.device = cfg(), torch.device("cuda:0")
            out[name] = mtp.verify_len(b)
            os.environ.pop("SNDR_ENABLE_PK0002", None)
        # a failed (or skipped) canary: not routed
        _cudart._CAPABILITY[0] = (9, 0)
        mtp._canary = lambda *a: False
        b = object.__new__(tq.TurboQuantMetadataBuilder)
        b.vllm_config, b.device = cfg(), torch.device("cuda:0")
        out["canary_failed"] = mtp.verify_len(b)
    finally:
        _cudart._CAPABILITY.clear()
        _cudart._CAPABILITY.update(orig)
    return out

# the forward: a marked batch through the wrapper on the CPU (synthetic rows under the interpreter)
HQ, HK, D, PAGE, K = 8, 2, 64, 16, 3
tq.get_current_vllm_config = lambda: SimpleNamespace(
    attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=32),
    model_config=SimpleNamespace(max_model_len=4096))
impl = tq.TurboQuantAttentionImpl(HQ, D, D ** -0.5, HK, kv_cache_dtype="turboquant_k8v4")

def verify_batch(lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    per = -(-max(lens) // PAGE)
    nb = b * per + 1
    cache = torch.zeros(nb, PAGE, HK, impl.tq_config.slot_size_aligned, dtype=torch.uint8)
    bt = torch.randperm(nb, generator=g)[: b * per].to(torch.int32).view(b, per).contiguous()
    for i, n in enumerate(lens):
        pos = torch.arange(n)
        reference.store(torch.randn(n, HK, D, generator=g), torch.randn(n, HK, D, generator=g) * 0.3,
                        cache, (bt[i, pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32))
    q = torch.randn(b * (K + 1), HQ * D, generator=g).to(torch.bfloat16)
    c = cam([K + 1] * b, lens)
    c.block_table_tensor = bt
    return q, cache, bt, c

@case("forward_marked_batch")
def _():
    lens = [37, 70, 20]
    q, cache, bt, c = verify_batch(lens)
    md = builder(K + 1).build(0, c)
    assert getattr(md, mtp.MARK) == K + 1
    out = torch.full((q.shape[0], HQ * D), float("nan"), dtype=torch.bfloat16)
    layer = torch.nn.Module()
    r = impl.forward(layer, q, q, q, cache.transpose(1, 2), md, output=out)
    ref = reference.spec_verify(q.view(-1, HQ, D), cache, bt, c.seq_lens, D ** -0.5, K)
    err = ((r.view(-1, HQ, D).double() - ref).norm() / ref.norm()).item()
    return {"same_buffer": r is out, "err": err, "nan": bool(r.isnan().any())}

@case("forward_unmarked_calls_vllm")
def _():
    seen = []
    fake_md = SimpleNamespace(num_actual_tokens=0)
    orig = tq.TurboQuantAttentionImpl.forward.__sndr_wraps__
    tq.TurboQuantAttentionImpl.forward.__sndr_wraps__  # noqa: B018
    w = mtp.wrap_forward(lambda *a: seen.append(len(a)) or "vllm")
    return [w(impl, None, None, None, None, None, fake_md), w(impl, None, None, None, None, None, None), seen,
            orig is not None]

@case("forward_marked_but_soa_restores_vllm_metadata")
def _():
    seen = []
    w = mtp.wrap_forward(lambda self, layer, q, k, v, kv, md, *rest: seen.append(summary(md)) or "vllm")
    q, cache, bt, c = verify_batch([40])
    md = builder(K + 1).build(0, c)
    impl._soa_store = True
    try:
        return [w(impl, None, q, q, q, cache.transpose(1, 2), md), seen]
    finally:
        impl._soa_store = False
'''


@pytest.fixture(scope="module")
def installed(vllm_py, tmp_path_factory, vllm_pin_root):
    from sndr.apply import run_apply

    root = tmp_path_factory.mktemp("pk0002") / "site"
    shutil.copytree(vllm_pin_root, root, ignore=shutil.ignore_patterns(".complete"))
    report = run_apply(root, load_patch_set(packs=False), environ={"SNDR_ENABLE_PK0002": "1"})
    assert report.ok, [p.model_dump() for p in report.problems]
    return run_cases(vllm_py, INSTALLED, root)


@pytest.mark.vllm_install
def test_runtime_patcher_installs_both_wrappers(installed):
    r = ok(installed, "outcomes")
    assert [v for _, v, _ in r["first"]] == ["applied", "applied"] or \
        all(v in ("applied", "pending") for _, v, _ in r["first"])
    assert [v for _, v in r["now"]] == ["applied", "applied"]
    assert r["build_wrapped"] and r["forward_wrapped"]


@pytest.mark.vllm_install
@pytest.mark.parametrize("name,marked", [
    ("uniform", True), ("uniform_padded", True), ("uniform_not_prefilling", True),
    ("prompt_chunk_of_k_plus_1", False), ("non_uniform", False), ("mixed_decode_and_verify", False),
    ("pure_decode", False), ("prefill", False), ("padding_in_the_middle", False),
])
def test_builder_marks_only_uniform_verify_batches(installed, name, marked):
    r = ok(installed, "build_" + name)
    assert r["marked"] == marked
    if marked:
        assert set(r["diff"]) == {"is_prefill", "num_decodes", "num_decode_tokens"}
        assert r["summary"]["is_prefill"] is False and r["summary"]["mark"] == 4
    else:
        assert r["diff"] == []  # exactly what vLLM built


@pytest.mark.vllm_install
def test_builder_off_outside_its_config(installed):
    assert ok(installed, "build_not_applicable")["marked"] is False
    assert ok(installed, "applicable") == {"mtp3_k8v4_cuda": 4, "cpu": 0, "no_spec": 0, "k16": 0,
                                           "mse_preset": 0, "dcp": 0, "sm89_default": 0, "sm89_opted_in": 4,
                                           "canary_failed": 0}


@pytest.mark.vllm_install
def test_capture_metadata_is_a_marked_decode(installed):
    r = ok(installed, "build_for_cudagraph_capture")
    assert r["is_prefill"] is False and r["mark"] == 4 and r["seq_lens"] == [1, 1]


@pytest.mark.vllm_install
def test_forward_runs_the_verify_attention_for_marked_batches(installed):
    r = ok(installed, "forward_marked_batch")
    assert r["same_buffer"] and not r["nan"] and r["err"] < 1e-2


@pytest.mark.vllm_install
def test_forward_passes_everything_else_to_vllm(installed):
    res, res_none, seen, _ = ok(installed, "forward_unmarked_calls_vllm")
    assert res == "vllm" and res_none == "vllm" and seen == [10, 10]
    out, seen = ok(installed, "forward_marked_but_soa_restores_vllm_metadata")
    assert out == "vllm" and seen == [{"is_prefill": True, "num_decodes": 0, "num_decode_tokens": 0, "mark": None}]


# ----------------------------------------------------------------------------- GPU harness


def make_baselines(dst: Path = ATTN_DIR) -> Path:
    """Copy turboquant_attn.py (shipped set applied), config.py, centroids.py and backends/utils.py of
    vLLM 0.32.0 into ``dst`` (an ignored folder). Needs the cached 0.32.0 tree (sndr.tree.fetch_version)."""
    import tempfile

    from sndr.apply import run_apply
    from sndr.tree import fetch_version

    src = fetch_version("0.32.0")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "site"
        shutil.copytree(src, root, ignore=shutil.ignore_patterns(".complete"))
        report = run_apply(root, load_patch_set(packs=False), environ={})
        assert report.ok, report.problems
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / TQ_ATTN, dst / "turboquant_attn.py")
    q = src / "vllm/model_executor/layers/quantization/turboquant"
    shutil.copy2(q / "config.py", dst / "config.py")
    shutil.copy2(q / "centroids.py", dst / "centroids.py")
    shutil.copy2(src / "vllm/v1/attention/backends/utils.py", dst / "backends_utils.py")
    return dst


ATTN_FILES = ("turboquant_attn.py", "config.py", "centroids.py", "backends_utils.py")
MODULE = "vllm.v1.attention.backends.turboquant_attn"


class _Log(logging.LoggerAdapter):
    def __init__(self, name):
        super().__init__(logging.getLogger(name), {})

    def warning_once(self, *a, **k):
        self.warning(*a)

    def info_once(self, *a, **k):
        self.info(*a)

    def debug_once(self, *a, **k):
        self.debug(*a)


def _stubs(ops, cfg) -> dict[str, types.ModuleType]:
    """Stand-ins for what turboquant_attn.py imports from vLLM (its kernels are the real ones)."""
    import ast
    import enum
    import typing

    import torch
    import triton
    import triton.language as tl

    mods: dict[str, types.ModuleType] = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    for pkg in ("vllm", "vllm.utils", "vllm.model_executor", "vllm.model_executor.layers",
                "vllm.model_executor.layers.quantization", "vllm.model_executor.layers.quantization.turboquant",
                "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.attention.ops",
                "vllm.v1.worker"):
        mod(pkg)
    mod("vllm.config", get_current_vllm_config=lambda: cfg)
    mod("vllm.config.cache", CacheDType=str)
    mod("vllm.logger", init_logger=_Log)
    mod("vllm.triton_utils", triton=triton, tl=tl)
    mod("vllm.utils.math_utils", round_up=lambda x, y: (x + y - 1) // y * y)
    T = typing.TypeVar("T")

    class AttentionCGSupport(enum.Enum):
        NEVER = 0
        UNIFORM_SINGLE_TOKEN_DECODE = 1
        UNIFORM_BATCH = 2
        ALWAYS = 3

    class AttentionImpl(typing.Generic[T]):
        pass

    class AttentionMetadataBuilder(typing.Generic[T]):
        pass

    mod("vllm.v1.attention.backend", AttentionBackend=type("AttentionBackend", (), {}),
        AttentionCGSupport=AttentionCGSupport, AttentionImpl=AttentionImpl, AttentionLayer=object,
        AttentionMetadata=type("AttentionMetadata", (), {}), AttentionMetadataBuilder=AttentionMetadataBuilder,
        AttentionType=SimpleNamespace(DECODER="decoder"), CommonAttentionMetadata=SimpleNamespace,
        MultipleOf=type("MultipleOf", (), {}))
    mod("vllm.v1.attention.backends.fa_utils", get_flash_attn_version=lambda *a, **k: None,
        is_flash_attn_varlen_func_available=lambda: False)
    # vLLM's own split_decodes_and_prefills, executed from its source
    utils_src = (ATTN_DIR / "backends_utils.py").read_text()
    fn = next(n for n in ast.parse(utils_src).body
              if isinstance(n, ast.FunctionDef) and n.name == "split_decodes_and_prefills")
    ns: dict = {"torch": torch, "CommonAttentionMetadata": SimpleNamespace}
    exec(compile("from __future__ import annotations\n" + ast.get_source_segment(utils_src, fn),
                 str(ATTN_DIR / "backends_utils.py"), "exec"), ns)
    mod("vllm.v1.attention.backends.utils", split_decodes_and_prefills=ns["split_decodes_and_prefills"])
    mod("vllm.v1.attention.ops.flydsl_turboquant_decode", flydsl_turboquant_decode_attention=None,
        is_flydsl_available=lambda: False, is_flydsl_gqa6_available=lambda: False)
    mods["vllm.v1.attention.ops.triton_turboquant_decode"] = ops.modules["triton_turboquant_decode"]
    mods["vllm.v1.attention.ops.triton_turboquant_store"] = ops.modules["triton_turboquant_store"]
    mods["vllm.v1.attention.ops.triton_decode_attention"] = ops.modules["triton_decode_attention"]
    mod("vllm.v1.kv_cache_interface", AttentionSpec=object,
        KVCacheLayout=enum.Enum("KVCacheLayout", ["LBNHC", "NHD"]))
    mod("vllm.v1.worker.workspace", current_workspace_manager=None, is_workspace_manager_initialized=lambda: False)
    return mods


def _exec(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


@pytest.fixture(scope="module")
def harness():
    yield from harness_session()


def harness_session():
    """The stubbed module with PK0002 installed by the RuntimePatcher (a generator: teardown restores)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the harness runs vLLM's Triton TurboQuant kernels: needs a CUDA GPU of sm_89+")
    pytest.importorskip("triton")
    from sndr.kernels.turboquant_k8v4 import _vllm_baseline

    tq_dir = _vllm_baseline.find_dir(REPO)
    if tq_dir is None or not all((ATTN_DIR / f).is_file() for f in ATTN_FILES):
        pytest.skip(f"needs vLLM 0.32.0's files in {ATTN_DIR} and .baselines/vllm032_tq "
                    "(python3 -m tests.patches.test_mtp_routing --make-baselines, then carry .baselines)")
    ops = _vllm_baseline.load(tq_dir)
    cfg = SimpleNamespace(attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=32),
                          model_config=SimpleNamespace(max_model_len=65536))
    mods = _stubs(ops, cfg)
    names = list(mods) + [MODULE, "vllm.model_executor.layers.quantization.turboquant.config",
                          "vllm.model_executor.layers.quantization.turboquant.centroids"]
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update(mods)
    patcher = None
    try:
        _exec("vllm.model_executor.layers.quantization.turboquant.centroids", ATTN_DIR / "centroids.py")
        _exec("vllm.model_executor.layers.quantization.turboquant.config", ATTN_DIR / "config.py")
        m = _exec(MODULE, ATTN_DIR / "turboquant_attn.py")
        unpatched = SimpleNamespace(build=m.TurboQuantMetadataBuilder.build, forward=m.TurboQuantAttentionImpl.forward)
        from sndr.startup.runtime import RuntimePatcher

        patcher = RuntimePatcher()
        outcomes = patcher.apply(_specs(), defer=False)
        yield SimpleNamespace(m=m, unpatched=unpatched, outcomes=outcomes, torch=torch)
    finally:
        if patcher is not None:
            patcher.revert()
        for n, v in saved.items():
            if v is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = v


def _harness_batch(h, hq, hk, d, page, k, lens, qlens=None, seed=0):
    torch = h.torch
    m = h.m
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    qlens = qlens or [k + 1] * len(lens)
    impl = m.TurboQuantAttentionImpl(hq, d, d ** -0.5, hk, kv_cache_dtype="turboquant_k8v4")
    layer = torch.nn.Module()
    b = len(lens)
    per = -(-max(lens) // page)
    nb = b * per + 2
    slot = impl.tq_config.slot_size_aligned
    lbnhc = torch.zeros(nb, page, hk, slot, dtype=torch.uint8, device=dev)
    cache = lbnhc.transpose(1, 2)  # the layer's view of an LBNHC allocation
    bt = torch.randperm(nb, generator=g, device=dev)[: b * per].to(torch.int32).view(b, per).contiguous()
    # the whole context through vLLM's store (do_kv_cache_update), prefix then the new tokens
    for i, n in enumerate(lens):
        pos = torch.arange(n, device=dev)
        slots = (bt[i, pos // page].long() * page + pos % page)
        kk = (torch.randn(n, hk * d, generator=g, device=dev) * 1.5).bfloat16()
        vv = (torch.randn(n, hk * d, generator=g, device=dev) * 0.5 + 0.2).bfloat16()
        impl.do_kv_cache_update(layer, kk, vv, cache, slots)
    n_tok = sum(qlens)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(qlens, dtype=torch.int32).cumsum(0)
    sl = torch.tensor(lens, dtype=torch.int32)
    cam = SimpleNamespace(
        query_start_loc=qsl.to(dev), query_start_loc_cpu=qsl, seq_lens=sl.to(dev), num_reqs=b,
        num_actual_tokens=n_tok, max_query_len=max(qlens), max_seq_len=max(lens), block_table_tensor=bt,
        slot_mapping=torch.zeros(n_tok, dtype=torch.int64, device=dev), is_prefilling=torch.zeros(b, dtype=torch.bool),
        seq_lens_cpu_upper_bound=sl)
    builder = object.__new__(m.TurboQuantMetadataBuilder)
    builder.reorder_batch_threshold = 1
    builder.vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        cache_config=SimpleNamespace(cache_dtype="turboquant_k8v4"),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
        model_config=SimpleNamespace(dtype=torch.bfloat16, get_num_attention_heads=lambda pc: hq,
                                     get_head_size=lambda: d))
    builder.kv_cache_spec = SimpleNamespace(num_kv_heads=hk, block_size=page)
    builder.device = torch.device(dev)
    q = torch.randn(n_tok, hq * d, generator=g, device=dev).bfloat16()
    kv_new = torch.zeros(n_tok, hk * d, device=dev, dtype=torch.bfloat16)  # already in the cache
    return SimpleNamespace(impl=impl, layer=layer, cache=cache, lbnhc=lbnhc, bt=bt, sl=sl, cam=cam,
                           builder=builder, q=q, kv=kv_new, n=n_tok, hq=hq, d=d)


def _assert_close_to_vllm(ours, upstream, x, hq: int, k: int) -> None:
    """Within 1e-2 of vLLM's output, and of float64's within 1.5x vLLM's own error (all three said on failure)."""
    from sndr.kernels.turboquant_k8v4 import reference

    ref = reference.spec_verify(x.q.view(x.n, hq, 128), x.lbnhc, x.bt, x.sl, 128 ** -0.5, k)
    rel = ((ours.double() - upstream.double()).norm() / upstream.double().norm()).item()
    err_ours = ((ours.view(x.n, hq, 128).double().cpu() - ref).norm() / ref.norm()).item()
    err_vllm = ((upstream.view(x.n, hq, 128).double().cpu() - ref).norm() / ref.norm()).item()
    said = f"ours vs vLLM {rel:.3g}, vs float64 {err_ours:.3g}; vLLM vs float64 {err_vllm:.3g}"
    assert rel < 1e-2 and err_ours < 1e-2 and err_ours < 1.5 * err_vllm + 1e-3, said


def _nan_rows(out, x) -> str:
    """Where an output holds NaN: (request, query token, heads) per row, for the failure message."""
    bad = out.view(x.n, x.hq, -1).isnan().any(-1).cpu()
    starts = x.cam.query_start_loc_cpu.tolist()
    where = []
    for r in range(x.n):
        heads = bad[r].nonzero().flatten().tolist()
        if heads:
            req = max(i for i in range(len(starts) - 1) if starts[i] <= r)
            where.append(f"request {req} (seq_len {int(x.sl[req])}) token {r - starts[req]}: heads {heads[:8]}"
                         f"{'...' if len(heads) > 8 else ''} ({len(heads)})")
    return "NaN at " + "; ".join(where[:12])


def _forward(h, x, patched: bool):
    torch = h.torch
    build = h.m.TurboQuantMetadataBuilder.build if patched else h.unpatched.build
    forward = h.m.TurboQuantAttentionImpl.forward if patched else h.unpatched.forward
    md = build(x.builder, 0, x.cam)
    out = torch.full((x.n, x.hq * x.d), float("nan"), dtype=torch.bfloat16, device="cuda")
    forward(x.impl, x.layer, x.q, x.kv, x.kv, x.cache, md, output=out)
    torch.cuda.synchronize()
    return out, md


@pytest.mark.gpu
def test_harness_patches_apply(harness):
    assert [o.verdict for o in harness.outcomes] == ["applied", "applied"], harness.outcomes


@pytest.mark.gpu
@pytest.mark.parametrize("hq,k,lens", [(32, 3, [3000, 1000, 517, 4096]), (64, 1, [2000, 33]),
                                       (32, 5, [8192, 100, 1500]), (16, 7, [900, 64]),
                                       # 48 and 64 rows per KV head: the warpgroup-MMA kernel (verify_wgmma.cu)
                                       (64, 5, [5000, 300, 9]), (64, 7, [4096, 77])])
def test_harness_uniform_verify_batch_matches_vllm(harness, hq, k, lens):

    x = _harness_batch(harness, hq, 8 if hq >= 32 else 4, 128, 16, k, lens, seed=hq + k)
    upstream, md0 = _forward(harness, x, patched=False)
    ours, md1 = _forward(harness, x, patched=True)
    assert md0.is_prefill and md0.num_decodes == 0  # vLLM: a prefill batch, per-request loop
    assert not md1.is_prefill and md1.sndr_verify_len == k + 1
    assert not upstream.isnan().any() and not ours.isnan().any(), _nan_rows(ours, x)
    _assert_close_to_vllm(ours, upstream, x, hq, k)


@pytest.mark.gpu
@pytest.mark.parametrize("f16_stages", [0, 2], ids=["one warpgroup", "warp-specialised"])
@pytest.mark.parametrize("hq,k,lens", [(64, 5, [5000, 300, 9]), (64, 7, [4096, 77]), (64, 3, [3000, 40])])
def test_harness_wgmma_kernels_match_vllm(harness, hq, k, lens, f16_stages, monkeypatch):
    """vLLM's own forward with each warpgroup-MMA kernel routed (32 / 48 / 64 rows per KV head): vLLM's output
    within 1e-2, and float64's within 1.5x vLLM's own error."""
    from sndr.kernels.turboquant_k8v4 import mtp_verify as mv

    cfg = mv.VerifyConfig(wgmma=1, wg=mv.verify_wg.WgConfig(f16_stages=f16_stages))
    monkeypatch.setattr(mv, "DEFAULT", cfg)
    x = _harness_batch(harness, hq, 8, 128, 16, k, lens, seed=hq + k + 1)
    upstream, _ = _forward(harness, x, patched=False)
    ours, md1 = _forward(harness, x, patched=True)
    assert md1.sndr_verify_len == k + 1
    assert any(key[9] == cfg and key[10] for key in mv._PLANS), "the wgmma kernel did not run"
    assert not ours.isnan().any(), _nan_rows(ours, x)
    _assert_close_to_vllm(ours, upstream, x, hq, k)


@pytest.mark.gpu
@pytest.mark.parametrize("qlens,lens", [([4, 2, 4], [3000, 700, 41]), ([1, 4, 4], [500, 900, 64])])
def test_harness_other_batches_are_byte_identical(harness, qlens, lens):
    x = _harness_batch(harness, 32, 8, 128, 16, 3, lens, qlens=qlens, seed=7)
    upstream, md0 = _forward(harness, x, patched=False)
    ours, md1 = _forward(harness, x, patched=True)
    assert not hasattr(md1, "sndr_verify_len") and md1.is_prefill == md0.is_prefill
    assert harness.torch.equal(upstream, ours)


if __name__ == "__main__":
    if "--make-baselines" in sys.argv:
        print(make_baselines())
