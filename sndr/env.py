"""Every environment variable sndr reads, in one place (the vLLM convention)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

#: ``SNDR_ENABLE_<ID>`` (a boolean: :data:`BOOL_WORDS`) overrides a patch's ``default``; ``<ID>`` is
#: matched case-insensitively (:func:`enable_override`), and one that names no patch is reported.
ENABLE_PREFIX = "SNDR_ENABLE_"
#: ``SNDR_PLUGINS=0``: every plugin patch (``kind = "plugin"``: sndr's GPU kernels) is off, except one
#: whose own ``SNDR_ENABLE_<ID>=1`` is set (the per-plugin variable wins over this global one).
PLUGINS = "SNDR_PLUGINS"
#: ``SNDR_STRICT=1``: a required patch that is not active aborts vLLM startup.
STRICT = "SNDR_STRICT"
#: Directory for per-process attestation records.
RUN_DIR = "SNDR_RUN_DIR"
#: Root of sndr's caches (fetched trees, compiled code). Defaults to $XDG_CACHE_HOME/sndr.
CACHE_DIR = "SNDR_CACHE_DIR"
#: Patch directory override for the hook and the CLI default.
PATCHES = "SNDR_PATCHES"
#: Deployment profile (TOML or JSON) that ``when`` predicates are evaluated against (see sndr/profile.py).
PROFILE = "SNDR_PROFILE"
#: Tree override for the hook (the directory that contains ``vllm/``).
TREE = "SNDR_TREE"
#: Test-only: kill the process at a named commit step (see tests/reliability).
FAULT = "SNDR_TEST_FAULT"
#: Test-only: ``SNDR_TEST_PAUSE=<point>`` makes a command wait (up to 60 s, saying so on stderr) at that point of
#: its start-up, so a test can send it a real SIGINT there: ``parsed`` (the command line is read, before the
#: command's boundary takes Ctrl-C over) or ``load`` (``apply`` is about to load the patch set). See
#: :func:`sndr.cli.pause_at`; unset, nothing waits.
PAUSE = "SNDR_TEST_PAUSE"
#: ``SNDR_OFFLINE=1``: ``vllm==X`` trees must come from the cache; never run pip.
OFFLINE = "SNDR_OFFLINE"
#: Test-only: interpreter of a real vLLM install (default :data:`DEFAULT_TEST_VLLM_PYTHON`; see
#: :func:`vllm_test_python`, the one place every ``vllm_install`` test and fixture reads it).
TEST_VLLM_PYTHON = "SNDR_TEST_VLLM_PYTHON"
#: The venv the README (and ``.ci/run``) builds: ``vllm==0.32.0 torch==2.13.0`` on CPU.
DEFAULT_TEST_VLLM_PYTHON = os.path.join(os.path.expanduser("~"), ".cache", "sndr", "vllm-0.32.0-venv", "bin", "python")
#: The one line that builds it (README "Tests").
TEST_VLLM_BUILD = ("python3 -m venv ~/.cache/sndr/vllm-0.32.0-venv && ~/.cache/sndr/vllm-0.32.0-venv/bin/pip install "
                   "vllm==0.32.0 torch==2.13.0 && ~/.cache/sndr/vllm-0.32.0-venv/bin/pip uninstall -y torchvision "
                   "torchaudio torchcodec")
#: vLLM's allow-list of general plugins (read by vLLM 0.32.0's ``vllm/plugins/__init__.py``): unset, vLLM loads
#: every ``vllm.general_plugins`` entry point; set, only those whose name is in ``value.split(",")``, compared
#: exactly (no strip, no case folding; ``""`` names none). sndr reads it only to say when it excludes sndr
#: (:func:`vllm_plugins_exclusion`); it never sets it.
VLLM_PLUGINS = "VLLM_PLUGINS"
#: The name of sndr's entry point in vLLM's ``vllm.general_plugins`` group (``pyproject.toml``):
#: ``sndr.startup.hook:register``, the name ``VLLM_PLUGINS`` must list.
PLUGIN_NAME = "sndr"
#: ``SNDR_HOOK=0``: the in-memory import hook stays inert in this process (its .pth still loads).
HOOK = "SNDR_HOOK"
#: TurboQuant k8v4 kernels' backend (:func:`tq_backend`): ``auto`` (CUDA where it supports the call, else Triton),
#: ``cuda`` (raise instead of falling back) or ``triton``.
TQ_BACKEND = "SNDR_TQ_BACKEND"
#: Path of the ``libnvrtc`` that compiles sndr's CUDA kernels (tried before the usual places).
NVRTC = "SNDR_NVRTC"
#: Directory holding the copied vLLM 0.32.0 TurboQuant kernel sources the tests and benchmarks compare against.
TQ_BASELINE = "SNDR_TQ_BASELINE"
#: Directory holding the copied vLLM 0.32.0 GDN kernel sources the tests and benchmarks compare against.
GDN_BASELINE = "SNDR_GDN_BASELINE"

def bad_input(code: str, message: str, **where: object) -> Exception:
    """:func:`sndr.errors.bad_input`, imported on first use: the warm startup path never needs it
    (errors' dataclasses cost more to import than everything this module does)."""
    from .errors import bad_input as make

    return make(code, message, **where)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
#: The words every boolean variable takes, as the messages print them.
BOOL_WORDS = "1/0 (also true/false, yes/no, on/off)"


def _bool(name: str, raw: str) -> bool | None:
    val = raw.strip().lower()
    if val in _TRUE:
        return True
    if val in _FALSE:
        return False
    return None


def _flag(name: str, environ: Mapping[str, str] | None) -> tuple[str | None, bool | None]:
    """(the raw value, its boolean: None where it is no boolean word), (None, None) where unset: the one read of a
    boolean variable, for :func:`env_flag` and :func:`_switch`."""
    raw = (os.environ if environ is None else environ).get(name)
    return (None, None) if raw is None else (raw, _bool(name, raw))


def env_flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable: ``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive); unset -> ``default``."""
    raw, val = _flag(name, environ)
    if raw is None:
        return default
    if val is None:
        raise bad_input("bad_env", f"{name}={raw!r} is not a boolean; use {BOOL_WORDS}", key=name)
    return val


def _switch(name: str, default: bool, on_typo: bool, typo_means: str, environ: Mapping[str, str] | None) -> bool:
    """A boolean switch that never raises: unset -> ``default``; a value that is no boolean -> ``on_typo``, said
    once on stderr ("NAME='x' is not a boolean (...); <typo_means>")."""
    raw, val = _flag(name, environ)
    if raw is None:
        return default
    if val is None:
        from .stderr import say

        say(f"{name}={raw!r} is not a boolean ({BOOL_WORDS}); {typo_means}", once_key=f"{name}-typo")
        return on_typo
    return val


def strict_mode(environ: Mapping[str, str] | None = None) -> bool:
    """``SNDR_STRICT`` (default 0). A value that is no boolean turns strict mode on, said once on stderr: a typo
    in a safety switch must not turn it off silently."""
    return _switch(STRICT, False, True, "treating it as 1 (strict)", environ)


def hook_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``SNDR_HOOK`` (default 1): False keeps the in-memory import hook inert. It is read inside ``import vllm``, so
    a value that is no boolean never raises: the hook stays active, said once on stderr."""
    return _switch(HOOK, True, True, "the in-memory hook stays active", environ)


def plugins_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``SNDR_PLUGINS`` (default 1): False turns off every plugin patch not enabled by its own variable."""
    return env_flag(PLUGINS, True, environ)


def enable_var(patch_id: str) -> str:
    """The variable that overrides a patch's ``default``: ``SNDR_ENABLE_`` + the id upper-cased,
    every character other than ``A-Z 0-9 _`` turned into ``_`` (``P23-wire.1`` -> ``SNDR_ENABLE_P23_WIRE_1``)."""
    return ENABLE_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", patch_id).upper()


def enable_override(patch_id: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """Value of :func:`enable_var` for ``patch_id``, or None when it is unset.

    The part after ``SNDR_ENABLE_`` is matched as :func:`enable_var` spells it (case-insensitive,
    ``-``/``.`` read as ``_``), as ``--only`` matches ids: ``SNDR_ENABLE_pn0001`` is
    ``SNDR_ENABLE_PN0001``. Two spellings with different values are an error naming both."""
    environ = os.environ if environ is None else environ
    want = enable_var(patch_id)
    names = [want] if want in environ else []
    names += [k for k in environ if k != want and k.startswith(ENABLE_PREFIX)
              and enable_var(k[len(ENABLE_PREFIX):]) == want]
    if not names:
        return None
    vals = []
    for name in sorted(names):
        val = _bool(name, environ[name])
        if val is None or not environ[name].strip():
            raise bad_input("bad_env", f"{name}={environ[name]!r} is not a boolean; use {BOOL_WORDS}", key=name,
                            patch=patch_id, hint=f"set {want}=1 to enable {patch_id} or {want}=0 to disable it")
        vals.append(val)
    if len(set(vals)) > 1:
        both = ", ".join(f"{n}={environ[n]}" for n in sorted(names))
        raise bad_input("bad_env", f"{both} name the same patch {patch_id} with different values", key=want,
                        patch=patch_id, hint=f"keep one of them ({want})")
    return vals[0]


# ----------------------------------------------------------------------------- locations


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """``patches`` or ``anchors`` shipped with sndr: ``<name>/`` of a checkout, or the wheel's copy.

    An installed wheel carries ``sndr/_data/<name>``; a checkout has ``<name>/``
    beside ``sndr/`` (recognised by its ``pyproject.toml``). A
    ``site-packages/<name>`` that some other project owns is never taken.
    """
    here = _package_dir()
    data = here / "_data" / name
    if data.is_dir() or not (here.parent / "pyproject.toml").is_file():
        return data
    return here.parent / name


def shipped_patches_dir() -> Path:
    return shipped_dir("patches")


#: The pin record in a patch directory ('_' keeps load.patch_files() from reading it as a patch); stdlib-only
#: here so that a command's parser names it without importing the pin model (sndr.pinrecord).
PIN_FILE_NAME = "_pin.toml"


def patches_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The patch set in effect: ``$SNDR_PATCHES`` when set and non-empty, else the shipped set.

    The CLI default, the loader, the startup hook, the watchlist and the pin
    file all resolve it here, so a process never attests another set than the
    CLI applied.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(PATCHES)
    return Path(override) if override else shipped_patches_dir()


def is_shipped_data(path: Path | str) -> bool:
    """Whether ``path`` lies in an installed sndr's shipped data (``.../sndr/_data/...``).

    The one rule for "never write here": a reinstall replaces that directory,
    so decisions, deviations, a pin or a manifest written into it are lost.
    A checkout's ``patches/`` (beside ``pyproject.toml``) is not shipped data.
    """
    p = Path(path).expanduser().resolve()
    roots = [_package_dir() / "_data"]
    for root in roots:
        if p == root or root in p.parents:
            return True
    parts = p.parts
    # another installed copy of sndr (another venv): site-packages/sndr/_data/...
    return any(parts[i] == "sndr" and parts[i + 1] == "_data" and i > 0
               and parts[i - 1] in ("site-packages", "dist-packages") for i in range(len(parts) - 1))


def writable_patches_dir(explicit: Path | str | None = None, environ: Mapping[str, str] | None = None, *,
                         flag: str = "--patches DIR") -> Path:
    """The patch directory sndr may WRITE into: ``explicit``, else ``$SNDR_PATCHES``, else the shipped set;
    refused (``shipped_data_write``, naming ``flag``) when it is an installed sndr's shipped data."""
    path = Path(explicit) if explicit is not None else patches_dir(environ)
    refuse_shipped_write(path, flag=flag)
    return path


def refuse_shipped_write(path: Path | str, *, flag: str) -> None:
    """Raise ``shipped_data_write`` when ``path`` (a file or directory to write) is :func:`is_shipped_data`."""
    if is_shipped_data(path):
        raise bad_input("shipped_data_write", f"{path} is the shipped data of the installed sndr: a reinstall "
                        f"would lose what is written there", file=str(path),
                        hint=f"pass {flag} (or set {PATCHES}) to a directory you keep, e.g. your patch set's checkout")


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$SNDR_CACHE_DIR``, else ``$XDG_CACHE_HOME/sndr``, else ``~/.cache/sndr``."""
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_DIR):
        return Path(environ[CACHE_DIR])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sndr"


#: The layout under :func:`cache_root`, named once. Every directory is reached through the cache-root
#: rule (:mod:`sndr.caches`: who may own it, and what happens when it is refused).
#: Fetched ``vllm==X`` trees, ``vllm-<ver>/`` each (:mod:`sndr.tree_release`).
CACHE_TREES = "trees"
#: Wheels ``pip download`` fetched, kept until extracted into :data:`CACHE_TREES`.
CACHE_WHEELS = "wheels"
#: Cross-process locks (``fetch.lock``: one download of a release at a time).
CACHE_LOCKS = "locks"
#: The startup hook's sealed code cache and memos (:mod:`sndr.startup.importer`).
CACHE_HOOK = "hook"
#: Per-process attestation records, a directory per tree (:mod:`sndr.startup.attest`).
CACHE_RUN = "run"
#: Compiled CUDA kernels (``sndr.kernels``).
CACHE_CUBIN = "cubin"
#: Plugin canary results (``sndr.kernels.canary``).
CACHE_CANARY = "canary"
#: The preflight's line index and changed-file lists (``changed/`` under it).
CACHE_PREFLIGHT = "preflight"


def plan_cache_name(python_tag: str) -> str:
    """The planner's cache directory under :func:`cache_root` for one Python (``plan-<tag>``: compile-ok
    memos and scope spans, :mod:`sndr.caches`)."""
    return f"plan-{python_tag}"


def vllm_test_python(environ: Mapping[str, str] | None = None) -> str:
    """Test-only: the interpreter of the real vLLM install the ``vllm_install`` tests use:
    ``$SNDR_TEST_VLLM_PYTHON``, else :data:`DEFAULT_TEST_VLLM_PYTHON` (it may not exist: callers skip,
    naming it and :data:`TEST_VLLM_BUILD`)."""
    environ = os.environ if environ is None else environ
    return environ.get(TEST_VLLM_PYTHON) or DEFAULT_TEST_VLLM_PYTHON


def pause_point(environ: Mapping[str, str] | None = None) -> str:
    """The start-up point ``$SNDR_TEST_PAUSE`` names (test-only; empty when unset)."""
    environ = os.environ if environ is None else environ
    return environ.get(PAUSE, "")


def tq_backend(environ: Mapping[str, str] | None = None) -> str:
    """``SNDR_TQ_BACKEND`` for both TurboQuant kernel packages (decode and verify): ``auto`` (unset or empty),
    ``cuda`` or ``triton``, any case and surrounding spaces; another value is a ValueError naming it."""
    raw = (os.environ if environ is None else environ).get(TQ_BACKEND, "auto")
    v = raw.strip().lower() or "auto"
    if v not in ("auto", "cuda", "triton"):
        raise ValueError(f"{TQ_BACKEND}={v!r}: expected auto, cuda or triton")
    return v


def names_sndr_loosely(name: str) -> bool:
    """Whether a ``VLLM_PLUGINS`` entry is :data:`PLUGIN_NAME` up to surrounding spaces and case: the one rule for
    the near misses vLLM's exact comparison rejects (the finding names them, the fix drops them)."""
    return name.strip().lower() == PLUGIN_NAME


def vllm_plugins_exclusion(environ: Mapping[str, str] | None = None) -> str | None:
    """Why vLLM will not call sndr's plugin under ``VLLM_PLUGINS`` here, or None when it will (unset, or a list
    naming :data:`PLUGIN_NAME`). vLLM's own rule, exactly: the value split on ``,``, each name compared as it
    is, so ``"a, sndr"`` (a space) and ``"SNDR"`` exclude sndr, and ``""`` excludes every plugin."""
    environ = os.environ if environ is None else environ
    raw = environ.get(VLLM_PLUGINS)
    if raw is None:
        return None
    names = raw.split(",")
    if PLUGIN_NAME in names:
        return None
    head = f"{VLLM_PLUGINS}={raw!r} does not name {PLUGIN_NAME!r}"
    if not raw.strip(","):
        return f"{head}: it names no plugin, so vLLM loads no general plugin"
    near = [n for n in names if n != PLUGIN_NAME and names_sndr_loosely(n)]
    if near:
        return (f"{head}: vLLM compares each comma-separated name exactly (no strip, no case folding), and "
                f"{', '.join(repr(n) for n in near)} is not {PLUGIN_NAME!r}")
    return f"{head}: vLLM loads only {', '.join(repr(n) for n in names if n)}"
