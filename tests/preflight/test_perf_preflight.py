"""Performance plugins on a bump: the preflight's performance section and the ``pin advance`` gate.

On the real 0.32.0 -> 0.33.0 trees: the Qwen GDN layer changed by 347 lines and gained a Triton
``fused_gdn_decode_post_conv_mtp`` (PK0003: re-measure), while the TurboQuant decode kernels are
unchanged (PK0001, PK0002: only a one-line ROCm condition around them, review). Hermetically: which
kind of change gives which verdict, and the gate's refusals and records.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sndr.__main__ import main as sndr_main
from sndr.load import load_patch_set
from sndr.model import Patch
from sndr.pinrecord import read_pin
from sndr.preflight.perf import performance_section, plugin_entry
from sndr.upstream.perfgate import gate_performance

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- real trees


@pytest.fixture(scope="module")
def section(vllm_pin_root, vllm_candidate_root):
    from sndr.preflight.snapshot import Snapshot
    from sndr.tree import open_tree

    ps = load_patch_set(REPO / "patches", packs=False)
    pin, cand = Snapshot(open_tree(str(vllm_pin_root))), Snapshot(open_tree(str(vllm_candidate_root)))
    return {p.id: p for p in performance_section(ps, pin.text_or_none, cand.text_or_none)}


def test_gdn_layer_changed_and_gained_a_triton_mtp_kernel(section):
    gdn = section["PK0003"]
    assert gdn.verdict == "re-measure"
    layer = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
    (whole,) = [c for c in gdn.changes if c.kind == "layer_file"]
    assert (whole.file, whole.added + whole.removed) == (layer, 347)
    (gained,) = [c for c in gdn.changes if c.kind == "gained"]
    assert gained.name == "fused_gdn_decode_post_conv_mtp_triton" and "Triton" in gained.detail
    assert "ops/fused_gdn_decode_post_conv_mtp.py" in gained.detail
    assert {c.kind for c in gdn.changes} >= {"bound", "kernel_file", "caller"}


def test_turboquant_decode_kernels_are_unchanged(section):
    kernel = "vllm/v1/attention/ops/triton_turboquant_decode.py"
    for pid in ("PK0001", "PK0002"):
        p = section[pid]
        assert f"kernel file {kernel}" in p.compared, p.compared
        assert not [c for c in p.changes if c.kind in ("bound", "kernel_file", "gained", "lost")], p.changes
        assert p.verdict == "review"  # the one line: FlyDSL's (ROCm) page-size condition in _decode_attention
        assert [c.name for c in p.changes if c.kind in ("caller", "callee")] == ["TurboQuantAttentionImpl._decode_attention"]


def test_the_committed_bump_report_has_the_section():
    text = (REPO / "docs" / "preflight-0.32.0-to-0.33.0.md").read_text()
    assert "## Performance plugins (2 to re-measure)" in text
    assert "| PK0003 | on | re-measure |" in text and "changed by 347 lines" in text
    # PK0004 (experimental, off by default) competes with the same layer: listed off, and re-measured too
    assert "| PK0004 | off | re-measure |" in text


# ----------------------------------------------------------------------------- hermetic: verdicts

LAYER = "vllm/layer.py"
OPS = "vllm/ops/kern.py"
PIN_OPS = "import triton\n\n@triton.jit\ndef _k(x):\n    pass\n\ndef kern(a, b):\n    return _k(a)\n"
PIN_LAYER = ("from vllm.ops.kern import kern\n\n\nclass Layer:\n    def forward(self, x):\n"
             "        return kern(x, 1)\n\n    def other(self):\n        return 2\n")


def _plugin() -> Patch:
    return Patch.model_validate({"id": "PK9", "title": "t", "kind": "plugin", "module": "sndr.kernels",
                                 "runtime": [{"name": "r", "target": "vllm.layer:kern",
                                              "replacement": "sndr.kernels:kern"}]})


def _entry(cand: dict[str, str]):
    pin = {LAYER: PIN_LAYER, OPS: PIN_OPS}
    return plugin_entry(_plugin(), pin.get, {**pin, **cand}.get, True)


def test_nothing_changed_is_unchanged():
    e = _entry({})
    assert e.verdict == "unchanged" and e.changes == []
    assert e.compared == [f"kern ({OPS})", f"kernel file {OPS}", f"caller Layer.forward ({LAYER})"]


def test_a_changed_kernel_is_re_measure_and_an_unrelated_layer_line_is_nothing():
    e = _entry({OPS: PIN_OPS.replace("pass", "return x * 2")})
    assert e.verdict == "re-measure" and [c.kind for c in e.changes] == ["kernel_file"]
    assert e.changes[0].detail == f"{OPS} changed by 2 lines (+1/-1)"
    assert _entry({LAYER: PIN_LAYER.replace("return 2", "return 3")}).verdict == "unchanged"


def test_a_changed_caller_is_review():
    e = _entry({LAYER: PIN_LAYER.replace("kern(x, 1)", "kern(x, 2) if x else None")})
    assert e.verdict == "review" and [c.kind for c in e.changes] == ["layer_file", "caller"]


def test_a_gained_triton_kernel_is_re_measure():
    new_ops = "vllm/ops/fast.py"
    layer = "from vllm.ops.fast import fast_mtp\n" + PIN_LAYER
    e = _entry({LAYER: layer, new_ops: "import triton\n\n@triton.jit\ndef _f():\n    pass\n\ndef fast_mtp(x):\n"
                "    return _f()\n"})
    assert e.verdict == "re-measure"
    assert [(c.kind, c.name) for c in e.changes] == [("layer_file", ""), ("gained", "fast_mtp")]


# ----------------------------------------------------------------------------- the pin advance gate


def _pre(tmp_path, verdicts: dict[str, str]) -> tuple[Path, dict]:
    data = {"performance": [{"id": k, "verdict": v} for k, v in verdicts.items()]}
    p = tmp_path / "pre.json"
    p.write_text(json.dumps(data))
    old = time.time() - 60
    os.utime(p, (old, old))
    return p, data


def _ref(tmp_path, name="perf.json", **body) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(body))
    return p


def test_re_measure_refuses_without_a_perf_ref(tmp_path):
    pre, data = _pre(tmp_path, {"PK0003": "re-measure", "PK0001": "review"})
    g, refs, waivers = gate_performance(data, pre, [], {}, "0.33.0")
    assert not g.ok and g.reason.startswith("PK0003: vLLM's competing code changed") and "--perf-ref" in g.reason


@pytest.mark.parametrize("body,why", [
    ({"plugin": "PK0003", "vllm": "0.32.0", "us": 1.0}, "measured against vLLM 0.32.0's kernels, not 0.33.0"),
    ({"plugin": "PK0003", "us": 1.0}, "does not say which vLLM's kernels"),
    ({"vllm": "0.33.0", "us": 1.0}, "names no plugin"),
    ({"plugin": "PK0003", "vllm": "0.33.0"}, "holds no measurement"),
])
def test_a_perf_ref_must_name_the_plugin_the_target_and_a_measurement(tmp_path, body, why):
    pre, data = _pre(tmp_path, {"PK0003": "re-measure"})
    g, _, _ = gate_performance(data, pre, [_ref(tmp_path, **body)], {}, "0.33.0")
    assert not g.ok and why in g.reason, g.reason


def test_a_perf_ref_older_than_the_preflight_is_refused(tmp_path):
    ref = _ref(tmp_path, plugin="PK0003", vllm="0.33.0", cells=[{"us": 31.2}])
    os.utime(ref, (time.time() - 600, time.time() - 600))
    pre, data = _pre(tmp_path, {"PK0003": "re-measure"})
    g, _, _ = gate_performance(data, pre, [ref], {}, "0.33.0")
    assert not g.ok and "older than the preflight" in g.reason


def test_a_good_perf_ref_or_a_waiver_passes_and_both_are_recorded(tmp_path):
    pre, data = _pre(tmp_path, {"PK0003": "re-measure", "PK0004": "re-measure", "PK0001": "review"})
    ref = _ref(tmp_path, plugin="PK0003", vllm="v0.33.0", cells=[{"us": 31.2}])
    g, refs, waivers = gate_performance(data, pre, [ref], {"PK0004": "not deployed on this fleet"}, "0.33.0")
    assert g.ok, g.reason
    assert refs == [f"PK0003 {ref} " + __import__("hashlib").sha256(ref.read_bytes()).hexdigest()]
    assert waivers == ["PK0004: not deployed on this fleet"]
    g, _, _ = gate_performance(data, pre, [ref], {"PK0004": "x", "PK0001": "y"}, "0.33.0")
    assert not g.ok and "--no-perf-ref names PK0001, which the preflight does not ask to re-measure" in g.reason


def test_a_preflight_without_the_section_is_refused(tmp_path):
    g, _, _ = gate_performance({"genuine_anchor_drift": []}, tmp_path / "pre.json", [], {}, "0.33.0")
    assert not g.ok and "no performance section" in g.reason


def test_pin_advance_cli_refuses_then_records_the_waiver(tmp_path, monkeypatch, capsys):
    """The whole command: every other gate passes (test_sync's fixtures); performance decides."""
    from sndr.upstream import pin as pinmod

    pre, data = _pre(tmp_path, {"PK0003": "re-measure"})
    calls = {}

    def fake_advance(to, **kw):
        calls.update(kw)
        g, refs, waivers = gate_performance(data, pre, kw["perf_refs"], kw["perf_waived"], to)
        rec = pinmod.PinRecord(version="0.33.0", perf_refs=refs or None, perf_waived=waivers or None) if g.ok else None
        if rec is not None:
            (tmp_path / "_pin.toml").write_text(rec.to_toml())
        return [g], rec

    monkeypatch.setattr(pinmod, "advance", fake_advance)
    monkeypatch.setattr(pinmod, "load_patch_set", lambda d: None, raising=False)
    base = ["advance", "--to", "0.33.0", "--preflight", str(pre), "--patches", str(tmp_path),
            "--pin-file", str(tmp_path / "_pin.toml")]
    assert sndr_main(["pin", *base]) == 1
    assert "gate performance: FAIL: PK0003" in capsys.readouterr().out
    assert sndr_main(["pin", *(base + ["--no-perf-ref", "PK0003=GDN runs vLLM's CUDA op by default here"])]) == 0
    rec = read_pin(tmp_path / "_pin.toml")
    assert rec is not None and rec.perf_waived == ["PK0003: GDN runs vLLM's CUDA op by default here"]
    assert sndr_main(["pin", *(base + ["--no-perf-ref", "PK0003"])]) == 2  # ID=REASON, never a bare id


def test_changes_are_listed_once_layer_level_first(section):
    """Two bound functions of one layer share callers: each changed caller is listed once, and the
    layer file's own size of change leads the list (the report's table cell is cut at its width)."""
    gdn = section["PK0003"]
    keys = [(c.file, c.name) for c in gdn.changes]
    assert len(keys) == len(set(keys)), keys
    assert gdn.changes[0].kind == "layer_file" and gdn.changes[0].added + gdn.changes[0].removed == 347
