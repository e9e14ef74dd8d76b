"""The startup path: code that runs inside every vLLM process.

* :mod:`.hook` - ``register()`` (vLLM's ``vllm.general_plugins`` entry point),
  ``sndr status`` and ``sndr hook install|remove``;
* :mod:`.importer` - the in-memory import hook, post-import hooks and the
  owner-checked caches behind a warm start;
* :mod:`.runtime` - runtime (object-level) patches with binding checks;
* :mod:`.attest` - per-process attestation records.

Everything here imports only the standard library and sndr's core (enforced by
``tests/test_architecture.py``): it runs at interpreter start in every process.
"""
