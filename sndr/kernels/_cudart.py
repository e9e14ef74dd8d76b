"""CUDA C++ kernels compiled at run time: NVRTC + the driver API, through ctypes.

No build step and no compiler in the image: NVRTC (``libnvrtc``) ships with
every CUDA build of torch (the ``nvidia-cuda-nvrtc`` wheel) and the driver
library (``libcuda.so.1``) with every GPU. A kernel is compiled once per
(source, defines, GPU architecture, NVRTC version) to a cubin, cached on disk
under ``$SNDR_CACHE_DIR/cubin`` (default ``~/.cache/sndr/cubin``, sealed entries under the
cache-root rule of :mod:`sndr.caches`, like the hook's code cache), and loaded
into the current device's primary context, the one torch uses. Launches go
onto torch's current stream, so they are captured by ``torch.cuda.graph``.

Every failure (no NVRTC, a compile error, a driver error) raises
:class:`CudaUnavailable` or :class:`CudaError` with the library's own message;
callers fall back to the Triton kernels on ``CudaUnavailable``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import re
import struct
import sys
import threading
from pathlib import Path

from .. import env as sndr_env
from .. import fsio

__all__ = ["CudaUnavailable", "CudaError", "Module", "Kernel", "Launch", "compile_cubin", "cubin_cache", "cubin_key",
           "load_module", "load_kernel", "nvrtc_version", "device_index", "capability", "sm_count"]


class CudaUnavailable(RuntimeError):
    """NVRTC or the driver library cannot be found or loaded."""


class CudaError(RuntimeError):
    """NVRTC or the driver reported an error."""


_LOCK = threading.Lock()
_NVRTC: list = []
_DRIVER: list = []


def _nvrtc_candidates() -> list[str]:
    out: list[str] = []
    env = os.environ.get(sndr_env.NVRTC)
    if env:
        out.append(env)
    major = None
    try:
        import torch

        if torch.version.cuda:
            major = torch.version.cuda.split(".")[0]
    except Exception:  # torch absent or broken: search the usual places anyway
        pass
    roots = [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
    found: list[str] = []
    for root in roots:
        found += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*"))
        found += glob.glob(os.path.join(root, "nvidia", "*", "*", "lib", "libnvrtc.so*"))
    found = [f for f in found if "builtins" not in os.path.basename(f)]
    # the NVRTC matching torch's CUDA major first
    found.sort(key=lambda f: (major is None or f".so.{major}" not in f, f))
    out += found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            out += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    lib = ctypes.util.find_library("nvrtc")
    if lib:
        out.append(lib)
    return out


def _nvrtc() -> ctypes.CDLL:
    if _NVRTC:
        return _NVRTC[0]
    with _LOCK:
        if _NVRTC:
            return _NVRTC[0]
        errors = []
        for cand in _nvrtc_candidates():
            try:
                lib = ctypes.CDLL(cand)
                lib.nvrtcVersion  # noqa: B018  (symbol check)
            except (OSError, AttributeError) as exc:
                errors.append(f"{cand}: {exc}")
                continue
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            _NVRTC.append(lib)
            return lib
        raise CudaUnavailable("libnvrtc not found (tried: " + ("; ".join(errors) or "no candidates") + ")")


def _driver() -> ctypes.CDLL:
    if _DRIVER:
        return _DRIVER[0]
    with _LOCK:
        if _DRIVER:
            return _DRIVER[0]
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaUnavailable(f"libcuda.so.1: {exc}") from exc
        _DRIVER.append(lib)
        return lib


_CAPABILITY: dict[int, tuple[int, int]] = {}
_SM_COUNT: dict[int, int] = {}


def device_index(x) -> int:
    """The CUDA device index of a tensor or a ``torch.device`` (no index: torch's current device)."""
    d = getattr(x, "device", x)
    if d.index is not None:
        return d.index
    import torch

    return torch.cuda.current_device()


def capability(idx: int) -> tuple[int, int]:
    """Device ``idx``'s compute capability, asked of torch once per process (the kernels' launch gates)."""
    if idx not in _CAPABILITY:
        import torch

        major, minor = torch.cuda.get_device_capability(idx)
        _CAPABILITY[idx] = (major, minor)
    return _CAPABILITY[idx]


def device_refusal(t, min_cap: tuple[int, int], need: str, broken: dict[int, str] | None = None) -> str | None:
    """Why a CUDA kernel cannot run on the device of ``t`` (a tensor or a ``torch.device``): not a CUDA device
    (ROCm included), a backend marked off there (``broken``: device index -> why), or a compute capability below
    ``min_cap`` (then ``need``, its ``{sm}`` replaced by the device's, e.g. ``sm_86``); None: it can. (The launch
    gates of TurboQuant's kernels, PK0002's verify route and PK0003's entries and CUDA step; the capability asked
    of torch once per device.)"""
    import torch

    d = getattr(t, "device", t)
    if d.type != "cuda" or torch.version.hip is not None:
        return "not a CUDA device"
    idx = device_index(d)
    if broken and idx in broken:
        return broken[idx]
    cap = capability(idx)
    return need.replace("{sm}", f"sm_{cap[0]}{cap[1]}") if cap < min_cap else None


def sm_count(idx: int) -> int:
    """Device ``idx``'s multiprocessor count, asked of torch once per process (the split plans)."""
    if idx not in _SM_COUNT:
        import torch

        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def nvrtc_version() -> tuple[int, int]:
    lib = _nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check_nvrtc(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
    return major.value, minor.value


def _check_nvrtc(lib: ctypes.CDLL, rc: int, what: str = "nvrtc") -> None:
    if rc != 0:
        raise CudaError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()} ({rc})")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaError(f"{what}: {msg.value.decode() if msg.value else 'error'} ({rc})")


_CUBIN_DIRS: dict[str, fsio.PrivateDir | None] = {}


def cubin_cache() -> fsio.PrivateDir | None:
    """``<cache root>/cubin`` under the cache-root rule (:func:`sndr.caches.open_dir`), opened once per
    process and root; None when the root or the directory is refused (then every kernel is compiled)."""
    from .. import caches

    root = caches.root_path()
    if root not in _CUBIN_DIRS:
        with _LOCK:
            if root not in _CUBIN_DIRS:
                _CUBIN_DIRS[root] = caches.open_dir(sndr_env.CACHE_CUBIN, "cubin cache", root=root,
                                                    without="every kernel is compiled with NVRTC instead")
    return _CUBIN_DIRS[root]


def cache_dir() -> Path:
    """Where the cubin cache lives (for messages; reads and writes go through :func:`cubin_cache`)."""
    return Path(sndr_env.cache_root()) / sndr_env.CACHE_CUBIN


_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.-]+)"[ \t]*$', re.M)


def read_source(path: Path) -> str:
    """A kernel's CUDA source with each ``#include "name"`` of a file beside it expanded in place (once per
    file, between ``#line`` directives, so NVRTC's messages name the right file and line). The text is
    what :func:`compile_cubin` keys its cache on, so a header's bytes are part of every key that uses it."""
    seen: set[str] = set()

    def expand(p: Path) -> str:
        text = p.read_text()
        out, last = [], 0
        for m in _INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(text[last:m.start()])
            if m.group(1) not in seen:
                seen.add(m.group(1))
                out.append(f'#line 1 "{m.group(1)}"\n{expand(p.with_name(m.group(1)))}\n#line {line + 1} "{p.name}"')
            last = m.end()
        return "".join(out) + text[last:]

    return expand(Path(path))


def _options(arch: str, defines: dict[str, int | str]) -> list[str]:
    opts = [f"--gpu-architecture=sm_{arch}", "-std=c++17", "--use_fast_math"]
    return opts + [f"-D{k}={v}" for k, v in sorted(defines.items())]


def cubin_key(source: str, name: str, opts: list[str], nvrtc: tuple[int, int]) -> str:
    """The cache entry's name: a sha256 this process computes over the exact source, options and NVRTC."""
    return hashlib.sha256("\0".join([source, name, *opts, repr(nvrtc)]).encode()).hexdigest()


def _nvrtc_compile(source: str, name: str, opts: list[str]) -> bytes:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None))
    try:
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise CudaError(f"compiling {name}.cu ({' '.join(opts)}):\n{log.value.decode(errors='replace')}")
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        buf = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_cubin(source: str, name: str, arch: str, defines: dict[str, int | str], *, cache: bool = True) -> bytes:
    """CUDA C++ -> cubin for ``sm_<arch>`` (e.g. "90"), cached on disk under the hook cache's trust rules.

    The entry ``<name>-sm<arch>-<key>.cubin`` (key: :func:`cubin_key`, computed
    here from the source this process holds) is sealed with the cubin
    directory's 0600 secret over its name and bytes. A cubin is loaded from the
    cache only when it carries that seal: one planted by another uid, copied
    from another cache, stored under another kernel's key or damaged is
    ignored and the kernel compiled again. Under a cache root that fails the
    rule (:mod:`sndr.caches`), no cubin is read or written at all.
    """
    opts = _options(arch, defines)
    entry = f"{name}-sm{arch}-{cubin_key(source, name, opts, nvrtc_version())}.cubin"
    d = cubin_cache() if cache else None
    if d is not None:
        hit = d.get_sealed("cubin", entry)
        if hit is not None:
            return hit
    cubin = _nvrtc_compile(source, name, opts)
    if d is not None:
        try:
            d.put_sealed("cubin", entry, cubin)
        except OSError:  # a read-only cache costs a recompile, nothing more
            pass
    return cubin


_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class Module:
    """A cubin loaded in the current device's context; its kernels by name."""

    def __init__(self, cubin: bytes, label: str):
        self._cubin = cubin  # the driver may read the image lazily
        self.label = label
        self.handle = ctypes.c_void_p()
        _check(_driver().cuModuleLoadData(ctypes.byref(self.handle), cubin), f"cuModuleLoadData({label})")
        self._kernels: dict[tuple[str, int], Kernel] = {}
        # the largest dynamic shared memory asked of each function: the driver's attribute belongs to the function,
        # which every Kernel of that name shares, so it is only ever raised (a smaller later ask lowering it would
        # make the earlier Kernel's launches fail with "invalid argument")
        self.smem_max: dict[str, int] = {}

    def kernel(self, name: str, dynamic_smem: int = 0) -> Kernel:
        k = self._kernels.get((name, dynamic_smem))
        if k is None:
            k = self._kernels[(name, dynamic_smem)] = Kernel(self, name, dynamic_smem)
        return k


class Kernel:
    """One ``extern "C"`` kernel of a loaded module."""

    def __init__(self, module: Module, name: str, dynamic_smem: int = 0):
        drv = _driver()
        self.module = module
        self.func = ctypes.c_void_p()
        _check(drv.cuModuleGetFunction(ctypes.byref(self.func), module.handle, name.encode()),
               f"cuModuleGetFunction({name})")
        self.name = name
        self.smem = int(dynamic_smem)
        # (any size: static + dynamic above 48 KiB needs it, whatever the dynamic part's size; never lowered)
        if self.smem > module.smem_max.get(name, 0):
            _check(drv.cuFuncSetAttribute(self.func, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem),
                   "cuFuncSetAttribute")
            module.smem_max[name] = self.smem

    def attribute(self, attr: int) -> int:
        v = ctypes.c_int()
        _check(_driver().cuFuncGetAttribute(ctypes.byref(v), attr, self.func), "cuFuncGetAttribute")
        return v.value

    @property
    def registers(self) -> int:
        return self.attribute(_CU_FUNC_ATTRIBUTE_NUM_REGS)

    @property
    def spill_bytes(self) -> int:
        return self.attribute(_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)

    def blocks_per_sm(self, block_threads: int) -> int:
        n = ctypes.c_int()
        _check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), self.func, block_threads, ctypes.c_size_t(self.smem)), "cuOccupancy")
        return n.value

    def launch(self, grid: int, block_threads: int, stream: int, args: list) -> None:
        """args: ctypes scalars (c_void_p for device pointers, c_int, c_float, c_longlong),
        kept alive by the caller's list until the call returns (the driver copies them)."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        rc = _LAUNCH[0](self.func, grid, 1, 1, block_threads, 1, 1, self.smem, stream, params, None)
        if rc:
            _check(rc, f"cuLaunchKernel({self.name})")


_LAUNCH: list = []
_LAUNCH_EX: list = []

# CUlaunchConfig (cuda.h): grid xyz, block xyz, shared bytes (u32 each), the
# stream at 32, the attribute array at 40, their count at 48; 56 bytes.
_CFG_FMT = "<7I4xQQI4x"
_CFG_STREAM = 32
# CUlaunchAttribute: id (u32), 4 bytes of padding, a 64-byte value union.
_ATTR_SIZE = 72
_ATTR_COOPERATIVE = 2
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_ARG = {"p": ("Q", 8), "q": ("q", 8), "i": ("i", 4), "f": ("f", 4)}


class Launch:
    """One kernel launch whose argument buffer and launch config are packed once.

    ``sig`` gives the kernel's parameters in order: ``p`` pointer, ``q`` int64,
    ``i`` int32, ``f`` float32. The parameters live in one ``bytearray`` that
    ``params`` points into, so a call changes only what differs (the data
    pointers, the stream) with ``struct.pack_into`` at :meth:`offset` and
    launches through ``cuLaunchKernelEx`` with no per-call ctypes objects.
    ``pdl``: programmatic stream serialization (sm_90), i.e. the kernel may be
    scheduled before the previous one on the stream ends and must wait for it
    itself (``griddepcontrol.wait``). ``cooperative``: every block resident at
    once, or the launch fails (blocks of the grid may wait for each other).
    """

    def __init__(self, kernel: Kernel, grid: int, block_threads: int, sig: str, values, *, pdl: bool = False,
                 cooperative: bool = False):
        if len(sig) != len(values):
            raise ValueError(f"{kernel.name}: {len(sig)} parameters, {len(values)} values")
        offs, pos = [], 0
        for c in sig:
            size = _ARG[c][1]
            pos = -(-pos // size) * size
            offs.append(pos)
            pos += size
        self.kernel, self.sig, self._offsets = kernel, sig, offs
        self.args = bytearray(max(8, pos))
        for c, o, v in zip(sig, offs, values):
            struct.pack_into("<" + _ARG[c][0], self.args, o, v)
        self._args_c = (ctypes.c_char * len(self.args)).from_buffer(self.args)  # pins the buffer
        base = ctypes.addressof(self._args_c)
        self._params = (ctypes.c_void_p * max(1, len(sig)))(*[base + o for o in offs])
        self.params = ctypes.addressof(self._params)
        attrs = [a for a, on in ((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, pdl), (_ATTR_COOPERATIVE, cooperative)) if on]
        nattr = len(attrs)
        self._attrs = bytearray(_ATTR_SIZE * max(1, nattr))
        for i, a in enumerate(attrs):
            struct.pack_into("<I4xi", self._attrs, i * _ATTR_SIZE, a, 1)
        self._attrs_c = (ctypes.c_char * len(self._attrs)).from_buffer(self._attrs)
        self.cfg = bytearray(56)
        struct.pack_into(_CFG_FMT, self.cfg, 0, grid, 1, 1, block_threads, 1, 1, kernel.smem, 0,
                         ctypes.addressof(self._attrs_c), nattr)
        self._cfg_c = (ctypes.c_char * len(self.cfg)).from_buffer(self.cfg)
        self.cfg_addr = ctypes.addressof(self._cfg_c)
        self.func = kernel.func.value
        self.grid, self.block_threads, self.pdl = grid, block_threads, pdl

    def offset(self, i: int) -> int:
        """Byte offset of parameter ``i`` in :attr:`args`."""
        return self._offsets[i]

    def set(self, i: int, value) -> None:
        struct.pack_into("<" + _ARG[self.sig[i]][0], self.args, self._offsets[i], value)

    def launch(self, stream: int) -> None:
        """Launch on ``stream`` (a raw ``CUstream`` handle) with the packed arguments."""
        struct.pack_into("<Q", self.cfg, _CFG_STREAM, stream)
        rc = _LAUNCH_EX[0](self.cfg_addr, self.func, self.params, None)
        if rc:
            _check(rc, f"cuLaunchKernelEx({self.kernel.name})")


def _setup_driver_signatures(drv: ctypes.CDLL) -> None:
    drv.cuLaunchKernel.argtypes = [
        ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    drv.cuModuleLoadData.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    drv.cuModuleGetFunction.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
    drv.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    drv.cuFuncGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    drv.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    drv.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.c_void_p]
    drv.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    drv.cuLaunchKernelEx.restype = ctypes.c_int
    if not _LAUNCH:
        _LAUNCH.append(drv.cuLaunchKernel)
    if not _LAUNCH_EX:
        _LAUNCH_EX.append(drv.cuLaunchKernelEx)


def tensor_map_tiled(address: int, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...]) -> bytes:
    """The 128 bytes of a tiled TMA tensor map over bytes (``cuTensorMapEncodeTiled``: uint8 elements, no
    interleave, no swizzle, 256-byte L2 promotion, zeros for out-of-bounds elements): ``dims`` elements per
    dimension, innermost first, ``strides`` the byte strides of the outer ones (len(dims) - 1, multiples of 16),
    ``box`` the copied box. Raises :class:`CudaError` with the driver's reason."""
    try:  # (CUDA 12+ drivers: looked up here, not with the signatures every kernel needs)
        encode = _driver().cuTensorMapEncodeTiled
    except AttributeError:
        raise CudaError("cuTensorMapEncodeTiled: not in this driver (CUDA 12 or newer needed)") from None
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
    encode.restype = ctypes.c_int
    n = len(dims)
    if len(strides) != n - 1 or len(box) != n:
        raise ValueError(f"tensor map: {n} dims, {len(strides)} strides, {len(box)} box sizes")
    buf = ctypes.create_string_buffer(128 + 64)  # the map must be 64-byte aligned; ctypes guarantees 16 bytes
    addr = -(-ctypes.addressof(buf) // 64) * 64
    gdim = (ctypes.c_uint64 * n)(*dims)
    gstr = (ctypes.c_uint64 * max(1, n - 1))(*strides)
    bdim = (ctypes.c_uint32 * n)(*box)
    estr = (ctypes.c_uint32 * n)(*([1] * n))
    uint8, no_interleave, no_swizzle, l2_256b, zero_fill = 0, 0, 0, 3, 0  # (cuda.h's CUtensorMap* enums)
    _check(encode(addr, uint8, n, ctypes.c_void_p(address), gdim, gstr, bdim, estr, no_interleave, no_swizzle,
                  l2_256b, zero_fill),
           f"cuTensorMapEncodeTiled(dims={dims}, strides={strides}, box={box})")
    return ctypes.string_at(addr, 128)


_MODULES: dict[tuple, Module] = {}


def load_module(source: str, defines: dict[str, int | str], device_index: int, label: str = "sndr",
                arch_suffix: str = "") -> Module:
    """Compile (or take from the disk cache) ``source`` and load it on one CUDA device. ``arch_suffix``
    "a": the architecture-specific target (e.g. sm_90a, for setmaxnreg), which runs on that exact one only."""
    import torch

    key = (hash(source), source, tuple(sorted(defines.items())), device_index, label, arch_suffix)
    m = _MODULES.get(key)
    if m is not None:
        return m
    major, minor = capability(device_index)
    cubin = compile_cubin(source, label, f"{major}{minor}{arch_suffix}", defines)
    drv = _driver()
    _setup_driver_signatures(drv)
    with torch.cuda.device(device_index):
        torch.cuda.current_stream(device_index)  # makes torch's primary context current on this thread
        torch.empty(1, device=f"cuda:{device_index}")
        m = Module(cubin, label)
    with _LOCK:
        return _MODULES.setdefault(key, m)


def load_kernel(source: str, name: str, defines: dict[str, int | str], device_index: int,
                dynamic_smem: int = 0, label: str | None = None, arch_suffix: str = "") -> Kernel:
    """One kernel of ``source`` (compiled and loaded once per device and defines)."""
    return load_module(source, defines, device_index, label or name, arch_suffix).kernel(name, dynamic_smem)
