"""Deprecated location of the startup hook; it lives in :mod:`sndr.startup.hook`.

Kept so that a vLLM image whose installed metadata still names
``sndr.hook:register`` keeps loading the plugin after an upgrade of sndr.
"""

from sndr.startup.hook import register  # noqa: F401
