"""PK0004 installed the way the startup hook installs it, stacked on PK0003, in a real vLLM 0.32.0 (CPU) install.

A child process of ``$SNDR_TEST_VLLM_PYTHON`` (as ``test_gdn_vllm_install.py``) resolves the shipped
set with ``SNDR_ENABLE_PK0004=1`` (``sndr.plan.enabled_set``'s order, as
``sndr.startup.resolve.build_resolved`` lists the runtime edits the hook installs), applies them with sndr's RuntimePatcher after ``import vllm``
and before the layer module, then checks: every PK0003 and PK0004 edit is ``applied`` (the static
binding check on the wheel's source and the live signature check passed); on
``QwenGatedDeltaNetAttention._forward_core_fused_norm`` and ``__init__`` PK0004's wrapper is the
outer one and wraps PK0003's, which wraps vLLM's; the route's wrapper reaches vLLM's module globals
(``get_forward_context``) through the chain; revert restores vLLM's methods. Without
``SNDR_ENABLE_PK0004`` the set installs no PK0004 edit (off by default).
"""

from __future__ import annotations

import pytest

from tests.patches.conftest import run_child

SCRIPT = r'''
import json, sys
from sndr.load import load_patch_set
from sndr.plan import enabled_set
from sndr.startup.runtime import RuntimePatcher

import vllm  # noqa: F401  (vLLM's plugin loader runs sndr's hook inside an imported vllm)
ps = load_patch_set(packs=False)
def runtime(environ):  # sndr.startup.resolve.build_resolved's runtime list (without its pack discovery)
    return [dict(r.model_dump(mode="json"), patch=pid, allowed=["sndr"])
            for pid in enabled_set(ps, "0.32.0", environ).ids for r in ps.by_id[pid].runtime]
off = {"runtime": runtime({})}
specs = [s for s in runtime({"SNDR_ENABLE_PK0004": "1"}) if s["patch"] in ("PK0003", "PK0004")]
patcher = RuntimePatcher()
patcher.apply(specs)
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as qwen
cls = qwen.QwenGatedDeltaNetAttention
out = {"off": [s["patch"] for s in off["runtime"] if s["patch"] == "PK0004"],
       "outcomes": sorted((o.key, o.verdict, o.reason) for o in patcher.outcomes.values())}
chain = {}
for name in ("_forward_core_fused_norm", "__init__"):
    f, marks = cls.__dict__[name], []
    while f is not None:
        marks.append(getattr(f, "__sndr_patch__", None) or f.__module__)
        f = getattr(f, "__sndr_wraps__", None)
    chain[name] = marks
out["chain"] = chain
import sndr.runtime_patches.gdn_replay as rp
w = rp.wrap_forward_core_fused_norm(cls.__dict__["_forward_core_fused_norm"])
out["globals_reach_vllm"] = w.__closure__ is not None and any(
    isinstance(c.cell_contents, dict) and "get_forward_context" in c.cell_contents for c in w.__closure__)
out["revert"] = patcher.revert()
out["restored"] = [getattr(cls.__dict__[n], "__sndr_patch__", None) is None for n in ("_forward_core_fused_norm", "__init__")]
print("SNDR_RESULT " + json.dumps(out, default=repr))
'''


@pytest.fixture(scope="module")
def child(vllm_py):
    return run_child(vllm_py, SCRIPT)


@pytest.mark.vllm_install
def test_pk0004_is_off_by_default(child):
    assert child["off"] == []


@pytest.mark.vllm_install
def test_pk0004_stacks_outermost_over_pk0003(child):
    verdicts = {o[0]: o[1] for o in child["outcomes"]}
    assert verdicts["PK0004/replay-verify"] == "applied" and verdicts["PK0004/replay-config"] == "applied"
    assert all(v == "applied" for v in verdicts.values()), child["outcomes"]
    mod = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
    assert child["chain"]["_forward_core_fused_norm"] == ["PK0004/replay-verify", "PK0003/decode-fused-norm", mod]
    assert child["chain"]["__init__"] == ["PK0004/replay-config", "PK0003/plain-decode-routing", mod]
    assert child["globals_reach_vllm"]
    assert child["restored"] == [True, True]
