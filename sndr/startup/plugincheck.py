"""Did vLLM call sndr's plugin? ``VLLM_PLUGINS`` checked, and the check after vLLM loads its general plugins.

vLLM calls ``sndr.startup.hook:register`` through its ``vllm.general_plugins``
entry point (``sndr``, :data:`sndr.env.PLUGIN_NAME`), and only when
``VLLM_PLUGINS`` is unset or names ``sndr`` exactly (vLLM 0.32.0:
``name in value.split(",")``, no strip, no case folding). A process where it
does not still runs the text patches (patched on disk, or served by the
in-memory hook) but none of the runtime and plugin patches (PK000x), and
writes no attestation of its own: nothing said.

* Where sndr's import hook is in the process (the ``.pth`` of ``sndr hook
  install``: :mod:`sndr._boot`), :func:`watch` wraps ``vllm.plugins.load_general_plugins``: once
  vLLM has loaded its plugins and ``register()`` has not run in the process,
  :func:`sndr.startup.hook.attest_without_plugin` attests it anyway, with the
  finding and the runtime patches that are therefore not active, says so on
  stderr, and under ``SNDR_STRICT=1`` stops vLLM's startup.
* Without the hook nothing of sndr runs in such a process: ``sndr status`` (in
  the environment it runs in; a readiness probe's is the container's) and
  ``apply`` check ``VLLM_PLUGINS`` with :func:`finding`.

Standard library and the core only (runs inside every vLLM process); imported by the ``.pth`` boot, so
its module level imports nothing (the rest is imported when vLLM loads its plugins).
"""

from __future__ import annotations

#: The vLLM module whose ``load_general_plugins`` calls the ``vllm.general_plugins`` entry points.
PLUGINS_MODULE = "vllm.plugins"
_MARK = "__sndr_plugin_check__"


def finding(environ=None) -> str | None:
    """The finding, with its reason code, when ``VLLM_PLUGINS`` in ``environ`` (default: this process's)
    keeps vLLM from calling sndr's plugin; None when it does not (unset, or naming ``sndr``)."""
    from .. import env as envmod

    why = envmod.vllm_plugins_exclusion(environ)
    if why is None:
        return None
    from ..errors import Problem

    return Problem("vllm_plugins_excludes_sndr", f"{why}; so vLLM never calls sndr's register() and sndr's runtime "
                   f"and plugin patches are not active in its processes; fix: {fix(environ)}, then restart vLLM"
                   ).render()


def not_called() -> str:
    """The finding when vLLM loaded its plugins without sndr's although ``VLLM_PLUGINS`` allows it."""
    from .. import env as envmod
    from ..errors import Problem

    return Problem("plugin_not_called", f"vLLM loaded its general plugins and did not call sndr's register(): the "
                   f"entry point {envmod.PLUGIN_NAME} = sndr.startup.hook:register (group vllm.general_plugins) is not "
                   "installed for this interpreter, so sndr's runtime and plugin patches are not active; fix: install "
                   "sndr with pip into this environment (not only on sys.path), then restart vLLM").render()


def fix(environ=None) -> str:
    """``set VLLM_PLUGINS=a,sndr or unset it``: the value that keeps the operator's plugins and adds sndr."""
    import os

    from .. import env as envmod

    raw = (os.environ if environ is None else environ).get(envmod.VLLM_PLUGINS) or ""
    keep = [n.strip() for n in raw.split(",") if n.strip() and not envmod.names_sndr_loosely(n)]
    return f"set {envmod.VLLM_PLUGINS}={','.join(keep + [envmod.PLUGIN_NAME])} (no spaces) or unset it"


def inactive(state, resolved: dict) -> None:
    """Record on ``state`` (a :class:`sndr.startup.hook._Process` vLLM did not call ``register()`` in) every enabled
    patch with a runtime part, which only ``register()`` installs: required ones as missing."""
    required: dict[str, bool] = {}
    for spec in resolved.get("runtime") or []:
        pid = str(spec.get("patch"))
        required[pid] = required.get(pid, False) or bool(spec.get("required", True))
    optional = sorted(p for p, r in required.items() if not r)
    if optional:
        state.problems.append(f"optional runtime patches not active either (vLLM did not call sndr's plugin): "
                              f"{', '.join(optional)}")
    state.missing.extend(f"{pid}: runtime patch not active: vLLM did not call sndr's plugin"
                         for pid in sorted(p for p, r in required.items() if r))


def watch(finder, on_not_called) -> None:
    """Wrap ``vllm.plugins.load_general_plugins`` when it is imported (now, if it already is); after each call
    that loaded vLLM's plugins, ``on_not_called(finding)`` (the boot passes
    :func:`sndr.startup.hook.attest_without_plugin`, a no-op where ``register()`` ran; it raises only under
    ``SNDR_STRICT=1``, and that stops vLLM's startup, as a failing ``register()`` does)."""
    finder.watch(PLUGINS_MODULE, lambda module: wrap(module, on_not_called))


def wrap(module, on_not_called) -> None:
    original = getattr(module, "load_general_plugins", None)
    if not callable(original) or getattr(original, _MARK, False):
        return

    def load_general_plugins(*args, **kwargs):
        out = original(*args, **kwargs)
        if getattr(module, "plugins_loaded", True):
            on_not_called(finding() or not_called())
        return out

    load_general_plugins.__wrapped__ = original  # type: ignore[attr-defined]
    load_general_plugins.__doc__ = original.__doc__
    setattr(load_general_plugins, _MARK, True)
    module.load_general_plugins = load_general_plugins
