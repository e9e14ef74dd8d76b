#!/usr/bin/env python3
"""Regenerate the committed, generated artifacts of the shipped patch set.

    python tools/regenerate.py          # rewrite them
    python tools/regenerate.py --check  # exit 1 when any is stale (CI runs this)

- anchors/vllm-<pin>.json: where every edit sits on the pin (sndr.manifest);
- docs/preflight-<pin>-to-<candidate>.md: the bump report of the shipped set.

Both are built with an empty environment, so SNDR_ENABLE_* in the caller's
shell never changes a committed file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sndr import PIN_VERSION  # noqa: E402
from sndr.load import load_patch_set  # noqa: E402
from sndr.manifest import build_manifest, manifest_name  # noqa: E402
from sndr.preflight.analysis import run_preflight  # noqa: E402
from sndr.preflight.render import render_markdown  # noqa: E402
from sndr.tree import open_tree  # noqa: E402

CANDIDATE = "0.33.0"


def artifacts() -> dict[Path, bytes]:
    patch_set = load_patch_set(ROOT / "patches", packs=False)
    pin = open_tree(f"vllm=={PIN_VERSION}")
    manifest = build_manifest(pin, patch_set)
    report = run_preflight(patch_set, f"vllm=={PIN_VERSION}", f"vllm=={CANDIDATE}", environ={}, watch=None)
    return {
        ROOT / "anchors" / manifest_name(manifest.vllm_version): manifest.to_json().encode(),
        ROOT / "docs" / f"preflight-{PIN_VERSION}-to-{CANDIDATE}.md": render_markdown(report, patch_set).encode(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed artifact is stale; write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path, data in artifacts().items():
        current = path.read_bytes() if path.exists() else None
        if current == data:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if args.check and stale:
        for p in stale:
            print(f"stale: {p} (run: python tools/regenerate.py)", file=sys.stderr)
        return 1
    for p in stale:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
