"""Static binding of runtime targets on the real 0.32.0 and 0.33.0 trees."""

from __future__ import annotations

from sndr.binding import check_binding, resolve_binding
from sndr.model import RuntimeEdit
from sndr.tree import open_tree


def _edit(target: str, signature: str | None = None) -> RuntimeEdit:
    return RuntimeEdit(name="e", target=target, replacement="sndr.startup.runtime:call_counter", signature=signature)


def test_method_binding_and_signature(vllm_pin_root):
    tree = open_tree(vllm_pin_root)
    ok = _edit("vllm.v1.core.sched.scheduler:Scheduler._update_after_schedule", "(self, scheduler_output)")
    assert check_binding(ok, tree.read_text)[0] == "applies"
    bad = _edit("vllm.v1.core.sched.scheduler:Scheduler._update_after_schedule", "(self, output, *, strict=)")
    verdict, reason, b = check_binding(bad, tree.read_text)
    assert verdict == "drifted" and "(self, scheduler_output)" in reason and b.line > 0


def test_reexported_name_is_followed_to_its_definition(vllm_pin_root):
    tree = open_tree(vllm_pin_root)
    b, rel, why = resolve_binding("vllm.v1.attention.backends.turboquant_attn", "triton_turboquant_decode_attention",
                                  tree.read_text)
    assert why == "" and rel == "vllm/v1/attention/ops/triton_turboquant_decode.py"
    assert b.signature.startswith("(query, kv_cache, block_table, seq_lens")


def test_missing_module_and_missing_name(vllm_pin_root):
    tree = open_tree(vllm_pin_root)
    assert check_binding(_edit("vllm.no_such_module:f"), tree.read_text)[0] == "file_missing"
    assert check_binding(_edit("vllm.v1.core.sched.scheduler:Scheduler.no_such"), tree.read_text)[0] == "drifted"


def test_signature_change_between_pins(vllm_pin_root, vllm_candidate_root):
    edit = _edit("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p", "(logits, k, p)")
    assert check_binding(edit, open_tree(vllm_pin_root).read_text)[0] == "applies"
    verdict, reason, _ = check_binding(edit, open_tree(vllm_candidate_root).read_text)
    assert verdict == "drifted" and "has_topp_only_rows" in reason
