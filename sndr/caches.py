"""The shell's side of the planner's disk caches: where they live, and turning them on.

The core (:mod:`sndr.plan`, :mod:`sndr.locate`) never looks for a cache
directory: a plan reads only what its reader returns and writes nothing,
whatever the environment says. A command that wants the speed-up calls
:func:`enable` once, with its environment; it opens
``<cache root>/plan-<python>`` as a :class:`sndr.fsio.PrivateDir` (walked from
``/`` without following symlinks, every directory on the way owned by root or
this uid and not writable by others, entries sealed with a 0600 secret) and
injects it. An unsafe or unwritable cache directory turns the caches off and
says so once; the plan is the same either way.

Two caches share the directory:

* ``ok-<sha256>``: "this exact patched text compiled under this Python";
* ``scopes-<sha256>.json``: the def/class spans of a source text (report labels).
"""

from __future__ import annotations

import os
import sys

from . import env, fsio

__all__ = ["disable", "enable", "open_plan_cache"]


def open_plan_cache(environ=None) -> fsio.PrivateDir | None:
    """The planner's cache directory under :func:`sndr.env.cache_root`, or None (said on stderr) when unsafe."""
    root = env.cache_root(environ)
    try:
        return fsio.PrivateDir.open(os.path.join(root, f"plan-{fsio.python_tag()}"), "plan cache")
    except fsio.UnsafeDirError as exc:
        print(f"sndr: {exc}; the plan cache is disabled (plans are the same, only slower)", file=sys.stderr)
    except OSError as exc:
        print(f"sndr: cannot use the plan cache under {root} ({exc.strerror}); continuing without it",
              file=sys.stderr)
    return None


def enable(environ=None) -> fsio.PrivateDir | None:
    """Inject the plan cache (or None) into the core; returns it."""
    from . import locate, plan

    cache = open_plan_cache(environ)
    plan.use_compile_memo(cache)
    locate.use_disk_cache(cache)
    return cache


def disable() -> None:
    from . import locate, plan

    plan.use_compile_memo(None)
    locate.use_disk_cache(None)
