"""Imported by the ``_sndr_hook.pth`` line at interpreter start: installs the in-memory hook.

Nothing here may break interpreter start-up. A failure is logged once and kept
in :data:`BOOT_ERROR`; ``sndr.startup.hook.register()`` reports it when vLLM loads its
plugins, and under ``SNDR_STRICT=1`` fails vLLM's startup with that message.
"""

BOOT_ERROR = None

try:
    import os as _os

    # sndr.env.FAULT, spelled out: importing sndr.env here would cost every interpreter start.
    if _os.environ.get("SNDR_TEST_FAULT") == "boot":
        raise RuntimeError("injected boot failure (SNDR_TEST_FAULT=boot)")
    from sndr.startup import importer as _importer
    from sndr.startup import plugincheck as _plugincheck

    def _attest_without_plugin(finding):
        from sndr.startup.hook import attest_without_plugin

        attest_without_plugin(finding)

    # a process vLLM loads its plugins in without calling sndr's (VLLM_PLUGINS) attests all the same
    _plugincheck.watch(_importer.install(memory=True), _attest_without_plugin)
except Exception as _exc:  # noqa: BLE001 - interpreter start must survive any error here
    BOOT_ERROR = f"{type(_exc).__name__}: {_exc}"
    try:
        import sys as _sys

        _sys.stderr.write(f"sndr: the in-memory import hook failed to start ({BOOT_ERROR}); vLLM will run "
                          f"UNPATCHED in this process (SNDR_STRICT=1 makes vLLM startup fail)\n")
    except Exception:  # noqa: BLE001
        pass
