"""Issue 33 HIGH 1 on a GPU: a cubin planted by another uid is never launched.

uid 65534 owns the cache root and stores the cubin of a kernel that writes
1337, validly sealed with its own secret, under the key of a kernel that
writes 1. Before the fix the launch wrote ``[1337, 1337, 1337, 1337]``. Also: a
cubin of another kernel renamed to this key in our own cache. Skipped without
CUDA (and the other-uid case without root). Run on the H200 through the
device tool:

    python3 -m pytest tests/kernels/test_cubin_trust_gpu.py -q
"""

from __future__ import annotations

import ctypes
import hmac  # noqa: F401 - the attacker child (uid 65534) may not read the stdlib: import it here
import os
import shutil
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from sndr import fsio, stderr  # noqa: E402
from sndr.kernels import _cudart  # noqa: E402

pytestmark = pytest.mark.gpu
NOBODY = 65534
KERNEL = 'extern "C" __global__ void k(int* o) {{ o[threadIdx.x] = {value}; }}\n'
WRITES_1, WRITES_1337 = KERNEL.format(value=1), KERNEL.format(value=1337)


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}{minor}"


def _entry(source: str) -> str:
    arch = _arch()
    return f"k-sm{arch}-{_cudart.cubin_key(source, 'k', _cudart._options(arch, {}), _cudart.nvrtc_version())}.cubin"


def _launch_writes_1() -> list[int]:
    kernel = _cudart.load_kernel(WRITES_1, "k", {}, 0)
    out = torch.zeros(4, dtype=torch.int32, device="cuda:0")
    stream = torch.cuda.current_stream(0).cuda_stream
    kernel.launch(1, 4, stream, [ctypes.c_void_p(out.data_ptr())])
    torch.cuda.synchronize()
    return out.tolist()


@pytest.fixture
def fresh(monkeypatch):
    try:
        _cudart.nvrtc_version()
    except _cudart.CudaUnavailable as exc:
        pytest.skip(f"no NVRTC: {exc}")
    monkeypatch.setattr(_cudart, "_CUBIN_DIRS", {})
    monkeypatch.setattr(_cudart, "_MODULES", {})
    monkeypatch.setattr(stderr, "_SAID", set())  # the said-once memory of sndr.stderr.say


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another uid, chown)")
def test_cubin_planted_by_another_uid_is_never_launched(fresh, monkeypatch, capsys):
    evil = _cudart.compile_cubin(WRITES_1337, "k", _arch(), {}, cache=False)  # NVRTC only; no CUDA context
    entry = _entry(WRITES_1)
    base = Path(tempfile.mkdtemp(prefix="sndr-cubin-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        root = base / "cache"
        root.mkdir(mode=0o755)
        os.chown(root, NOBODY, NOBODY)
        pid = os.fork()
        if pid == 0:  # the attacker: file operations only, as uid 65534
            code = 1
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                d = fsio.PrivateDir.open(root / "cubin", "cubin cache")
                d.put_sealed("cubin", entry, evil)
                code = 0 if d.get_sealed("cubin", entry) == evil else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert (root / "cubin" / entry).stat().st_uid == NOBODY
        monkeypatch.setenv("SNDR_CACHE_DIR", str(root))
        assert _launch_writes_1() == [1, 1, 1, 1]
        err = capsys.readouterr().err
        assert "cubin cache is disabled" in err and f"owned by uid {NOBODY}" in err, err
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_cubin_of_another_kernel_under_this_key_is_never_launched(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("SNDR_CACHE_DIR", str(tmp_path / "cache"))
    _cudart.compile_cubin(WRITES_1337, "k", _arch(), {})  # a sealed entry of our own cache, other key
    d = tmp_path / "cache" / "cubin"
    shutil.copy(d / _entry(WRITES_1337), d / _entry(WRITES_1))
    assert _launch_writes_1() == [1, 1, 1, 1]
