#!/usr/bin/env python3
"""Bump preflight: classify every patch on the pin and on a candidate vLLM.

A thin wrapper over ``python -m sndr preflight`` (see sndr/commands/preflight.py):

    python tools/bump_preflight.py --pin vllm==0.32.0 --candidate vllm==0.33.0 \\
        [--patches DIR] [--json OUT] [--markdown OUT] [--sarif OUT] [--github] \\
        [--fail-on drift|ambiguous|any|config|none]

Exit codes: 0 clean, 1 findings at or above --fail-on, 2 bad input, 3 internal error.
"""

import sys
from pathlib import Path

# Run from a checkout without installing sndr.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sndr.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["preflight", *sys.argv[1:]]))
