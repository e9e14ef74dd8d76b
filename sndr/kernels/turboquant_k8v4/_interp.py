"""Test-only shim for running Triton kernels under TRITON_INTERPRET=1.

Triton 3.6's interpreter turns a loop bound into an int with
``int(array_of_shape_1)``, which numpy >= 2.4 refuses. Re-patch ``__index__``
to take the single element. Harmless on older numpy; no effect when the
interpreter is not used.
"""

from __future__ import annotations


def fix_scalar_index() -> None:
    import numpy as np
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_tensor
    if getattr(orig, "_sndr_scalar_index", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._sndr_scalar_index = True  # type: ignore[attr-defined]  # a marker attribute on the function object
    interpreter._patch_lang_tensor = patched
