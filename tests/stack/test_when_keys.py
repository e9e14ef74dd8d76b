"""Issue 31: the `when` keys a real stack needs (model_class, is_hybrid, quant_format, tool_call_parser),
`"*"` as "any value, an unknown one included", and the operator's `force` list for unknown keys."""

from __future__ import annotations

import argparse
import json

import pytest

from sndr.errors import SndrError
from sndr.load import PatchSet, load_patch_set
from sndr.model import Patch
from sndr.plan import enabled_set
from sndr.profile import Profile, check_when, evaluate, parse_profile, process_profile


def P(pid: str, when: dict) -> Patch:
    return Patch.model_validate({"id": pid, "title": pid, "when": when, "files": [{"path": "vllm/x.py", "edits": [
        {"name": "e", "anchor": "a\n", "replacement": "b\n"}]}]})


def test_new_keys_validate_and_normalise():
    assert check_when({"is_hybrid": True}) == {"is_hybrid": "true"}
    assert check_when({"is_hybrid": [False]}) == {"is_hybrid": ["false"]}
    assert check_when({"model_class": ["qwen3_5", "qwen3_next"], "quant_format": "fp8",
                       "tool_call_parser": "qwen3_*"})["tool_call_parser"] == "qwen3_*"
    assert check_when({"model_arch": ["*"]}) == {"model_arch": ["*"]}
    with pytest.raises(ValueError, match="is_hybrid must be true or false"):
        check_when({"is_hybrid": "maybe"})
    assert P("A", {"is_hybrid": True}).when == {"is_hybrid": "true"}


def test_star_matches_any_value_including_unknown():
    assert evaluate({"model_arch": ["*"]}, Profile()) == (True, "", "")
    assert evaluate({"model_arch": "*", "gpu_capability": "*"}, Profile()) == (True, "", "")
    prof = Profile({"model_arch": "LlamaForCausalLM"})
    assert evaluate({"model_arch": ["*"]}, prof)[0]
    # "*" among others still matches everything; a key without "*" still gates when unknown.
    assert evaluate({"model_arch": ["Qwen*", "*"], "platform": "cuda"}, prof)[1] == "when_unknown"


@pytest.mark.parametrize("when, facts, expect", [
    ({"model_class": "qwen3_*"}, {"model_class": "qwen3_next"}, (True, "")),
    ({"model_class": ["qwen3_5", "qwen3_6"]}, {"model_class": "qwen3_next"}, (False, "when_mismatch")),
    ({"is_hybrid": True}, {"is_hybrid": "true"}, (True, "")),
    ({"is_hybrid": True}, {"is_hybrid": "false"}, (False, "when_mismatch")),
    ({"quant_format": ["fp8", "compressed_tensors"]}, {"quant_format": "compressed_tensors"}, (True, "")),
    ({"quant_format": "auto_round*"}, {"quant_format": "none"}, (False, "when_mismatch")),
    ({"tool_call_parser": ["qwen3_coder", "qwen3_xml"]}, {"tool_call_parser": "qwen3_xml"}, (True, "")),
    ({"tool_call_parser": "qwen3_xml"}, {}, (False, "when_unknown")),
])
def test_new_keys_evaluate(when, facts, expect):
    ok, code, _ = evaluate(check_when(when), Profile(facts, source="p"))
    assert (ok, code) == expect


def test_force_enables_despite_unknown_keys_never_despite_a_mismatch(tmp_path):
    prof = parse_profile('model_class = "qwen3_next"\nforce = ["A", "B"]\n', "p.toml")
    assert prof.force == frozenset({"A", "B"})
    ps = PatchSet(patches=[P("A", {"is_hybrid": True, "model_class": "qwen3_*"}),
                           P("B", {"model_class": "llama", "is_hybrid": True}),
                           P("C", {"is_hybrid": True})])
    gates = enabled_set(ps, "0.32.0", {}, profile=prof).gates
    assert gates["A"].enabled and gates["A"].code == "when_forced" and "is_hybrid" in gates["A"].reason
    assert (gates["B"].enabled, gates["B"].code) == (False, "when_mismatch")  # known and different: still gated
    assert (gates["C"].enabled, gates["C"].code) == (False, "when_unknown")  # not in the force list


@pytest.mark.parametrize("text, line, needle", [
    ('is_hybrid = "sometimes"\n', 1, "is_hybrid must be true or false"),
    ('name = "x"\nforce = "PN1"\n', 2, "force must be a list of patch ids"),
    ('force = ["1bad"]\n', 1, "force must be a list of patch ids"),
])
def test_bad_profile_values_name_the_line(text, line, needle):
    with pytest.raises(SndrError) as info:
        parse_profile(text, "p.toml")
    (prob,) = info.value.problems
    assert prob.code == "bad_profile" and prob.line == line and needle in prob.message


def test_profile_takes_a_toml_boolean():
    assert parse_profile("is_hybrid = true\n", "p.toml").get("is_hybrid")[0] == "true"
    assert parse_profile('{"is_hybrid": false}', "p.json").get("is_hybrid")[0] == "false"


def test_patch_file_with_new_keys_loads(tmp_path):
    (tmp_path / "A.toml").write_text('id = "A"\ntitle = "a"\nwhen = { is_hybrid = true, model_class = ["qwen3_5"] }\n'
                                     '[[files]]\npath = "vllm/x.py"\n[[files.edits]]\nname = "e"\nanchor = "x"\n'
                                     'replacement = "y"\n')
    (p,) = load_patch_set(tmp_path, packs=False).patches
    assert p.when == {"is_hybrid": "true", "model_class": ["qwen3_5"]}


def _parser():
    ap = argparse.ArgumentParser(add_help=False)
    for a in ("--model", "--revision", "--quantization", "--kv-cache-dtype", "--speculative-config"):
        ap.add_argument(a)
    return ap


@pytest.mark.parametrize("config, expect", [
    ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
      "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
      "quantization_config": {"quant_method": "compressed-tensors"}},
     {"model_arch": "Qwen3NextForCausalLM", "model_class": "qwen3_next", "is_hybrid": "true",
      "quant_format": "compressed_tensors"}),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3",
      "layer_types": ["sliding_attention", "full_attention"]},
     {"model_class": "gemma3", "is_hybrid": "false", "quant_format": "none"}),
    ({"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-M",
      "quantization_config": {"quant_method": "fp8"}},
     {"is_hybrid": "true", "quant_format": "fp8"}),
    ({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
      "text_config": {"layer_types": ["linear_attention", "full_attention"]}},
     {"model_class": "qwen3_5", "is_hybrid": "true"}),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"},  # no layer kinds: unknown, never guessed
     {"model_class": "llama", "is_hybrid": None}),
])
def test_process_profile_reads_the_model_config(tmp_path, config, expect):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    prof = process_profile({}, argv=["vllm", "serve", str(model), "--tool-call-parser", "qwen3_coder"],
                           parser_factory=_parser)
    for key, value in expect.items():
        got, where = prof.get(key)
        assert got == value, (key, where)
        if value is None:
            assert "declare is_hybrid in the profile" in where
    assert prof.get("tool_call_parser")[0] == "qwen3_coder"


@pytest.mark.parametrize("argv, expect", [
    (["vllm", "serve", "m", "--tool-call-parser=hermes"], "hermes"),
    (["vllm", "serve", "m", "--tool_call_parser", "qwen3_xml"], "qwen3_xml"),
    (["vllm", "serve", "m"], "none"),
    (["vllm", "serve", "m", "--tool-call-parser"], None),
])
def test_tool_call_parser_from_the_command_line(argv, expect):
    assert process_profile({}, argv=argv, parser_factory=_parser).get("tool_call_parser")[0] == expect


def test_force_survives_into_the_process_profile(tmp_path):
    (tmp_path / "p.toml").write_text('force = ["A"]\n')
    prof = process_profile({"SNDR_PROFILE": str(tmp_path / "p.toml")}, argv=["python"], parser_factory=_parser)
    assert prof.force == frozenset({"A"})
    assert Profile(force=["A"]).fingerprint() != Profile(force=["B"]).fingerprint()  # memo keys see it


def test_list_shows_a_forced_patch_with_its_reason(tmp_path, capsys, monkeypatch):
    import os

    from sndr.__main__ import main

    d = tmp_path / "patches"
    d.mkdir()
    (d / "A-a.toml").write_text('id = "A"\ntitle = "a"\nwhen = { is_hybrid = true }\n[[files]]\npath = "vllm/x.py"\n'
                                '[[files.edits]]\nname = "e"\nanchor = "x"\nreplacement = "y"\n')
    (tmp_path / "p.toml").write_text('force = ["A"]\n')
    for k in [k for k in os.environ if k.startswith("SNDR_")]:
        monkeypatch.delenv(k)
    rc = main(["list", "--patches", str(d), "--profile", str(tmp_path / "p.toml"), "--json", "-"])  # in process
    out, err = capsys.readouterr()
    assert rc == 0, err
    (row,) = json.loads(out)["patches"]
    assert row["verdict"] == "enabled" and row["reason"].startswith("when_forced: forced on by the profile's force list")
