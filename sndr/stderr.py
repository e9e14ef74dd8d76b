"""The one stderr warning line: ``sndr: message``, at most once per key (stdlib only).

Imported at interpreter start by the import hook (:mod:`sndr.startup.common`) and by the
core (:mod:`sndr.caches`), where ``logging`` may not be configured yet and a problem must
not stop the work.
"""

from __future__ import annotations

import sys

_SAID: set[str] = set()


def say(message: str, once_key: str | None = None) -> None:
    """A loud, dependency-free ``sndr: message`` line on stderr, at most once per ``once_key``.

    For the paths where ``logging`` may not be configured yet or a problem must
    not stop the work (a refused cache, a startup warning). A closed or broken
    stderr never raises out of it.
    """
    if once_key is not None:
        if once_key in _SAID:
            return
        _SAID.add(once_key)
    try:
        sys.stderr.write(f"sndr: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must never break a cache lookup or an import
        pass
