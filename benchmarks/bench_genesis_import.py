"""Measure ``sndr import genesis`` on a checkout of the seed system (README, "Importing a stack").

Converts the checkout statically, then plans the imported set on a vLLM tree with every patch
enabled (``SNDR_ENABLE_<ID>=1``), a profile whose ``force`` lists them all (their ``when`` keys
are unknown here), and ``--keep-going``: once as imported, once with version ranges and lifecycle
ignored. Prints the counts of the README table. Nothing is written outside a temporary folder::

    git -C sndr_core_engine archive 34e26930 sndr | tar -x -C /tmp/seed
    python benchmarks/bench_genesis_import.py /tmp/seed --tree ~/.cache/sndr/trees/vllm-0.24.0
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sndr.env import enable_var  # noqa: E402
from sndr.errors import SndrError  # noqa: E402
from sndr.fsio import atomic_write  # noqa: E402
from sndr.load import load_patch_set  # noqa: E402
from sndr.plan import build_plan  # noqa: E402
from sndr.profile import Profile  # noqa: E402
from sndr.tomlwrite import dumps_patch  # noqa: E402
from sndr.tree import open_tree  # noqa: E402
from sndr.upstream.genesis import convert  # noqa: E402


def _summary(plan) -> dict:
    return {"status": dict(collections.Counter(p.status for p in plan.patches)),
            "gated": dict(collections.Counter(p.reason_code for p in plan.patches if p.status == "gated")),
            "left_out": dict(collections.Counter(lo.code for lo in plan.left_out)),
            "problems": [p.code for p in plan.problems]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the seed-system checkout (its root, holding sndr/dispatcher/registry.py)")
    ap.add_argument("--tree", required=True, help="the vLLM tree to plan on (directory, wheel or vllm==X)")
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    tree = open_tree(args.tree)

    def read(rel: str):
        try:
            return tree.read_text(rel)
        except SndrError:
            return None

    res = convert(args.src, exists=lambda rel: read(rel) is not None)
    why = collections.Counter(("runtime" if "no TextPatcher" in w else "no_module" if "no apply_module" in w
                               else "shares_module" if "shares apply_module" in w else "unreadable")
                              for w in res.skipped.values())
    ids = [p.id for p in res.patches]
    env = {enable_var(i): "1" for i in ids}
    prof = Profile(force=ids)
    out = {"registry_not_imported": dict(why), "imported": len(ids),
           "edits": sum(len(f.edits) for p in res.patches for f in p.files),
           "files": len({f.path for p in res.patches for f in p.files}), "notes": len(res.notes)}
    version = tree.version
    loose = [p.model_copy(update={"vllm": "", "lifecycle": "experimental" if p.lifecycle == "retired" else p.lifecycle})
             for p in res.patches]
    for key, patches in (("as_imported", res.patches), ("ranges_and_lifecycle_ignored", loose)):
        with tempfile.TemporaryDirectory() as d:  # through the files, in their order, as `sndr.apply` sees them
            for p in patches:
                (Path(d) / f"{p.id}.toml").write_text(dumps_patch(p), encoding="utf-8")
            ps = load_patch_set(Path(d), packs=False)
            out[key] = _summary(build_plan(ps, read, version, environ=env, keep_going=True, profile=prof))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        atomic_write(args.json, (text + "\n").encode("utf-8"), durable=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
