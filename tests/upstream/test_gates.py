"""sndr/upstream/gates.py: the pin gate's shared pieces (version spelling, what a benchmark reference is)."""

from __future__ import annotations

import os

import pytest

from sndr.upstream.gates import benchmark_ref_problem, norm_version


@pytest.mark.parametrize("spelt,version", [("vllm==0.33.0", "0.33.0"), ("v0.33.0", "0.33.0"), (" 0.33.0 ", "0.33.0"),
                                           ("vendor-1", "vendor-1"), ("v", "v")])
def test_a_target_reads_as_its_version(spelt, version):
    assert norm_version(spelt) == version


@pytest.mark.parametrize("name,text,why", [
    ("ref.json", '{"decode_us": 31.8}', None),
    ("ref.json", '{"rows": [{"name": "x"}]}', "no"),          # JSON without a number measures nothing
    ("ref.json", "{}", "no"),
    ("ref.json", "{not json", "json"),
    ("ref.md", "| cell | 31.8 us |", None),
    ("ref.md", "no figures here", "no"),
    ("ref.txt", "   \n", "empty"),
])
def test_a_benchmark_reference_must_record_a_measurement(tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    problem = benchmark_ref_problem(path)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and str(path) in problem and why in problem.lower(), problem


def test_a_binary_reference_only_has_to_be_non_empty(tmp_path):
    path = tmp_path / "trace.bin"
    path.write_bytes(b"\xff\xfe\x00\x01")
    assert benchmark_ref_problem(path) is None


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "ref.json"
    os.mkfifo(path)
    with pytest.raises(Exception) as info:  # noqa: PT011 - fsio's FileProblem, whatever its exact class
        benchmark_ref_problem(path)
    assert "regular" in str(info.value) or "fifo" in str(info.value).lower()
