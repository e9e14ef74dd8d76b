"""Load-time checks of a patch file's words (issue 32 LOW): ``when`` values against each key's vocabulary,
the file name against the ``id``, the ``[[files]]`` table name, and profile facts."""

from __future__ import annotations

import textwrap

import pytest

from sndr.errors import SndrError
from sndr.load import parse_patch
from sndr.profile import parse_profile

BASE = textwrap.dedent('''\
    id = "PN0007"
    title = "t"
    when = WHEN

    [[files]]
    path = "vllm/x.py"

    [[files.edits]]
    name = "a"
    anchor = "x = 1\\n"
    replacement = "x = 2\\n"
    ''')


def _problems(text: str, name: str = "patches/PN0007-x.toml") -> list[str]:
    try:
        parse_patch(text, name)
    except SndrError as exc:
        return [p.render() for p in exc.problems]
    return []


@pytest.mark.parametrize(("when", "why"), [
    ('{ platform = "gpu" }', "when.platform 'gpu' matches none of cuda, rocm, cpu, xpu, tpu"),
    ('{ platform = ["cuda", "nvidia"] }', "when.platform 'nvidia' matches none of"),
    ('{ platform = "rcom" }', "(did you mean 'rocm'?)"),
    ('{ kv_cache_dtype = "FP8" }', "when.kv_cache_dtype 'FP8' is not a value vLLM reports: lower case"),
    ('{ spec_method = "MTP" }', "when.spec_method 'MTP' is not a value vLLM reports"),
    ('{ model_arch = "Qwen3 Next" }', "when.model_arch 'Qwen3 Next' is not a value vLLM reports"),
])
def test_a_when_value_outside_the_vocabulary_is_an_error_of_the_file(when, why):
    """``when = { platform = "gpu" }`` was accepted, so the patch was gated forever."""
    problems = _problems(BASE.replace("WHEN", when))
    assert problems and why in problems[0] and "patches/PN0007-x.toml" in problems[0], problems


@pytest.mark.parametrize("when", ['{ platform = "cuda" }', '{ platform = ["cuda", "rocm"] }', '{ platform = "cu*" }',
                                  '{ kv_cache_dtype = "fp8*" }', '{ quantization = "compressed-tensors" }',
                                  '{ quantization = "none" }', '{ model_arch = "Qwen3*ForCausalLM" }',
                                  '{ spec_method = ["mtp", "eagle3"] }', '{ gpu_capability = ">=8.9" }'])
def test_documented_values_and_patterns_load(when):
    assert _problems(BASE.replace("WHEN", when)) == []


def test_a_profile_fact_outside_the_vocabulary_is_an_error_with_its_line():
    with pytest.raises(SndrError) as exc:
        parse_profile('name = "p"\nplatform = "gpu"\n', "prod.toml")
    [p] = exc.value.problems
    assert p.file == "prod.toml" and p.line == 2 and "platform 'gpu' matches none of" in p.message
    assert parse_profile('platform = "cuda"\nkv_cache_dtype = "fp8_e4m3"\n', "ok.toml").facts["platform"] == "cuda"
