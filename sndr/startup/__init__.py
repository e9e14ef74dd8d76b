"""The startup path: code that runs inside every vLLM process.

* :mod:`.hook` - ``register()`` (vLLM's ``vllm.general_plugins`` entry point),
  ``sndr status`` and ``sndr hook install|remove``;
* :mod:`.importer` - the in-memory import hook and post-import hooks (one
  ``sys.meta_path`` finder);
* :mod:`.resolve` - the resolved patch set and the memory plan, memoised under
  the fingerprint of their inputs (a warm start reads them instead of planning);
* :mod:`.hookcache` - the owner-checked, sealed cache behind a warm start, and
  the safe-directory helpers;
* :mod:`.common` - the log line, an exception in one line, a file's bytes and sha256;
* :mod:`.runtime` - runtime (object-level) patches with binding checks;
* :mod:`.attest` - per-process attestation records.

Everything here imports only the standard library and sndr's core (enforced by
``tests/test_architecture.py``): it runs at interpreter start in every process.
"""
