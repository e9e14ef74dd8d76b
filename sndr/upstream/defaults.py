"""The upstream cycle's names and defaults, stdlib only: the commands' parsers read them without importing
the engines (so ``--help`` imports no pydantic), and the engines import them from here."""

from __future__ import annotations

#: Kept decisions and deviations of the sync cycle, in a patch directory.
DECISIONS_NAME = "sync-decisions.yaml"
#: The sync surface configuration (``surface = [globs]``), in a patch directory.
SYNC_CONFIG_NAME = "_sync.toml"
#: Lines of the pin's file an anchor may take on each side of a hunk's changed lines.
DEFAULT_MAX_CONTEXT = 20
#: Lines of the diff's context that may be dropped on each side when the pin differs from the diff's base.
DEFAULT_FUZZ = 2
