"""Following upstream vLLM.

- the sync queue (``sync plan|decide|deviation``): :mod:`.sync` (CLI and public names), built from
  :mod:`.gitio` (git, batched), :mod:`.diff` (the one unified-diff parser), :mod:`.judge` (one change on the
  simulated tree), :mod:`.lines` (line ownership), :mod:`.reverts` (squash-form revert pairing),
  :mod:`.queue` (the planner) and :mod:`.report` (JSON model and Markdown);
- kept decisions and deviations (``patches/sync-decisions.yaml``): :mod:`.decisions`;
- the pin and its gates (``pin show|advance``): :mod:`.pin`;
- the watchlist of upstream PRs: :mod:`.watchlist` (schema, lint, edits) and :mod:`.triggers` (``check``);
- the YAML round-trip editor both files share: :mod:`.yamledit`;
- unified diff -> patch file: :mod:`.vendor`.
"""
