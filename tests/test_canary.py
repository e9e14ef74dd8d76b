"""The plugins' first-use canary (sndr.kernels.canary), on the CPU with stand-in kernels.

A stand-in ``run()`` plays the kernel: it returns (error against the float64
reference, tolerance) or raises like a failed build or launch. What is proved:
a wrong kernel (a mismatch, a NaN, an exception) is ``canary_failed`` and
named in the log with the device; a pass is cached, and a cached pass is taken
only for exactly the same kernel hash, GPU, driver and problem (an entry of
another kernel hash, or one copied under another name, is not trusted); an
unsafe cache directory is refused; ``SNDR_STRICT=1`` refuses to start on a
failure; the verdicts reach the attestation, ``sndr status``'s lines and the
Prometheus facts. The real kernels' canaries: tests/kernels/test_canary_tq.py
(CPU) and tests/kernels/test_canary_gpu.py (GPU).
"""

from __future__ import annotations

import json
import os

import pytest

from sndr.__main__ import main as sndr_main
from sndr.kernels import canary
from sndr.startup import hook, metrics, status
from sndr.startup.runtime import StrictError

IDENT = {"gpu": "NVIDIA H200", "capability": "9.0", "driver": "13.0", "cuda": "13.0"}
DEVICE = "NVIDIA H200 (cuda:0, sm_90, driver 13.0, CUDA 13.0)"


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SNDR_STRICT", raising=False)
    canary.reset()
    yield
    canary.reset()


class Kernel:
    """A stand-in kernel: counts its runs; ``err`` is what the comparison with the reference gives."""

    def __init__(self, err: float = 1e-3, exc: Exception | None = None):
        self.err, self.exc, self.runs = err, exc, 0

    def __call__(self) -> tuple[float, float]:
        self.runs += 1
        if self.exc is not None:
            raise self.exc
        return self.err, 2e-2


def check(run, kernel_hash="k" * 64, ident=IDENT, config="cuda d=128 Hq=32 Hk=8 page=16 bfloat16"):
    return canary.check("PK0001", config, device=DEVICE, identity=ident, kernel_hash=kernel_hash, run=run)


def test_a_right_kernel_passes_and_the_pass_is_cached():
    k = Kernel()
    r = check(k)
    assert r.status == canary.PASSED and not r.cached and k.runs == 1
    assert check(k) is r and k.runs == 1  # the process remembers its verdict
    canary.reset()  # a new process: the cache answers
    again = check(k)
    assert again.status == canary.PASSED and again.cached and k.runs == 1


@pytest.mark.parametrize("kernel,why", [
    (Kernel(err=0.7), "mismatch: relative error 0.7 > 0.02"),
    (Kernel(err=float("nan")), "mismatch: relative error nan"),
    (Kernel(exc=RuntimeError("cuLaunchKernelEx: an illegal memory access was encountered (700)")),
     "RuntimeError: cuLaunchKernelEx: an illegal memory access"),
    (Kernel(exc=OSError("libnvrtc not found")), "OSError: libnvrtc not found"),
])
def test_an_injected_wrong_kernel_is_caught_and_named_with_the_device(kernel, why, capsys):
    r = check(kernel)
    assert r.status == canary.FAILED and why in r.why
    err = capsys.readouterr().err
    assert "PK0001 canary_failed on NVIDIA H200 (cuda:0, sm_90" in err and why in err
    assert "vLLM's own path runs" in err
    canary.reset()  # a failure is never cached: the next process runs the kernel again
    assert check(kernel).status == canary.FAILED and kernel.runs == 2


def test_a_cache_entry_for_another_kernel_hash_is_not_trusted(tmp_path):
    assert check(Kernel(), kernel_hash="a" * 64).status == canary.PASSED
    canary.reset()
    wrong = Kernel(err=0.5)
    r = check(wrong, kernel_hash="b" * 64)
    assert wrong.runs == 1 and r.status == canary.FAILED and not r.cached
    # nor another driver or GPU with the same kernel
    canary.reset()
    r = check(wrong, kernel_hash="a" * 64, ident=dict(IDENT, driver="12.8"))
    assert r.status == canary.FAILED and wrong.runs == 2


def test_an_entry_copied_under_another_name_or_edited_is_not_trusted(tmp_path):
    check(Kernel(), kernel_hash="a" * 64)
    cdir = tmp_path / "cache" / "canary"
    (a,) = [p for p in cdir.iterdir() if p.suffix == ".json"]
    b_name = canary.entry_name("PK0001", "cuda d=128 Hq=32 Hk=8 page=16 bfloat16", IDENT, "b" * 64)
    (cdir / b_name).write_bytes(a.read_bytes())  # the HMAC covers the name: a moved pass is no pass
    canary.reset()
    wrong = Kernel(err=0.5)
    assert check(wrong, kernel_hash="b" * 64).status == canary.FAILED and wrong.runs == 1
    # a forged payload under the right name (the attacker lacks the secret) is no pass either
    body = json.dumps({"plugin": "PK0001", "result": "pass"}).encode()
    a.write_bytes(b"\0" * 32 + body)
    canary.reset()
    assert check(wrong, kernel_hash="a" * 64).status == canary.FAILED and wrong.runs == 2


def test_an_unsafe_cache_directory_is_refused_and_the_canary_still_runs(tmp_path, capsys):
    root = tmp_path / "cache"
    (root / "canary").mkdir(parents=True)
    os.chmod(root / "canary", 0o777)
    k = Kernel()
    assert check(k).status == canary.PASSED and k.runs == 1
    assert "canary cache is refused" in capsys.readouterr().err
    canary.reset()
    assert not check(k).cached and k.runs == 2


def test_strict_mode_refuses_to_start_on_a_failed_canary(monkeypatch):
    monkeypatch.setenv("SNDR_STRICT", "1")
    with pytest.raises(StrictError, match=r"(?s)PK0001 canary_failed on NVIDIA H200.*refusing to start vLLM"):
        check(Kernel(err=0.3))
    assert check(Kernel()).status == canary.FAILED  # the verdict stands for the process (no retry)


def test_a_skip_is_not_fatal_even_under_strict(monkeypatch, capsys):
    monkeypatch.setenv("SNDR_STRICT", "1")
    r = canary.skip("PK0002", "K=3", DEVICE, "sm_80 (sm_89+ covered)")
    assert r.status == canary.SKIPPED
    assert "PK0002 canary_skipped on NVIDIA H200" in capsys.readouterr().err


def test_a_first_call_inside_a_capture_is_a_skip_that_is_not_remembered(capsys):
    """Both plugins' canaries record the capture skip through one helper: a skip, said on stderr, with the one
    reason text, and not remembered (the next eager call of the shape runs the canary)."""
    r = canary.skip_in_capture("PK0003", "MTP T=4", DEVICE)
    assert r.status == canary.SKIPPED and r.why == canary.IN_CAPTURE
    assert "PK0003 canary_skipped on NVIDIA H200" in capsys.readouterr().err
    assert canary.results() == []


def test_verdicts_reach_the_attestation_status_and_metrics(monkeypatch):
    state = hook._Process(strict=False)
    monkeypatch.setattr(hook, "_STATE", state)
    check(Kernel())
    check(Kernel(err=0.9), config="cuda d=64 Hq=8 Hk=8 page=16 float16")  # the worst verdict wins
    canary.skip("PK0002", "K=3", DEVICE, "first call inside a CUDA-graph capture", remember=False)
    check(Kernel(), config="cuda d=64 Hq=4 Hk=4 page=16 float16")  # a later pass does not hide the failure
    rec = state.record()
    assert rec["canary"]["PK0001"]["status"] == canary.FAILED
    assert rec["canary"]["PK0002"]["status"] == canary.SKIPPED
    lines = status.canary_lines(rec)
    assert lines[0].startswith("PK0001 canary_failed: mismatch") and "NVIDIA H200" in lines[0]
    assert lines[1].startswith("PK0002 canary_skipped: first call inside")
    f = metrics.facts_of_record(rec)
    assert (f.canary_failed, f.canary_skipped) == (1, 1)


def test_status_prints_the_canary_lines(tmp_path, monkeypatch, capsys):
    from sndr.startup.attest import write_record

    run_dir = tmp_path / "run"
    state = hook._Process(strict=False)
    monkeypatch.setattr(hook, "_STATE", state)
    check(Kernel(exc=RuntimeError("nvrtc: compilation failed")))
    rec = state.record()
    write_record(str(run_dir / f"{os.getpid()}-1.json"), rec)
    assert sndr_main(["status", "--run-dir", str(run_dir)]) in (0, 1)
    out = capsys.readouterr().out
    assert "PK0001 canary_failed: RuntimeError: nvrtc: compilation failed" in out


def test_prometheus_textfile_carries_the_canary_gauges(tmp_path):
    pytest.importorskip("prometheus_client")
    rec = {"pid": 7, "role": "worker", "enabled": ["PK0001"], "canary": {
        "PK0001": {"status": canary.FAILED}, "PK0002": {"status": canary.PASSED}}}
    path = tmp_path / "sndr.prom"
    metrics.write_textfile(str(path), [rec], [])
    text = path.read_text()
    assert 'sndr_plugin_canary_failed{pid="7",role="worker"} 1.0' in text
    assert 'sndr_plugin_canary_skipped{pid="7",role="worker"} 0.0' in text
