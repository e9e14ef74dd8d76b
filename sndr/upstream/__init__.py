"""Following upstream vLLM: the sync queue and the pin (:mod:`.sync`), the
watchlist of upstream PRs (:mod:`.watchlist`), and unified diff -> patch file
(:mod:`.vendor`)."""
