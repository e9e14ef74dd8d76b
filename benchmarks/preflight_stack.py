"""A big patch stack that fell behind, cut from real vLLM code, and its labelled truth.

    python benchmarks/preflight_stack.py --out DIR [--pin 0.24.0] [--candidate 0.32.0] [--patches 260] [--seed 11]

There is no real 260-patch third-party stack here, so this builds one the way
such a stack looks: every anchor is 2-6 real lines of the pin release (0.24.0),
in the files local patches touch (engine, scheduler, workers, attention,
models, entrypoints, config), one to three edits per patch. Nothing is made
up but the replacement comments. By the candidate (0.32.0) most of them have
drifted or their file is gone, as they would for a team that skipped eight
releases.

Truth, for the calibration and the multi-hop test, comes from difflib alone
(``tests/preflight_oracle.py``), never from sndr:

* :func:`direct_truth` - the anchor's place on the candidate by one comparison;
* :func:`hop_truth` - the anchor followed through every release in between,
  each hop by the same difflib oracle (a region that moved in one release and
  was edited in another is tracked; a region lost on any hop has vanished).
"""

from __future__ import annotations

import argparse
import random
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sndr.model import Edit, FileEdits, Patch  # noqa: E402
from sndr.tomlwrite import dumps_patch  # noqa: E402
from sndr.tree import fetch_version  # noqa: E402
from tests.preflight_oracle import true_location  # noqa: E402

#: Where local patches live (prefixes of vllm/ paths), weighted by how often stacks touch them.
HOT = [
    ("vllm/v1/worker/", 5), ("vllm/v1/core/", 4), ("vllm/v1/engine/", 3), ("vllm/v1/attention/", 3),
    ("vllm/v1/spec_decode/", 2), ("vllm/v1/sample/", 2), ("vllm/model_executor/models/", 5),
    ("vllm/model_executor/layers/", 4), ("vllm/entrypoints/", 3), ("vllm/config/", 2), ("vllm/distributed/", 2),
    ("vllm/engine/", 1), ("vllm/multimodal/", 1), ("vllm/lora/", 1), ("vllm/compilation/", 1),
]
#: Intended mix of edits on the candidate (the rest survive).
DRIFT_SHARE = 0.62


@lru_cache(maxsize=16)
def texts(version: str) -> dict[str, str]:
    root = fetch_version(version)
    out = {}
    for p in (root / "vllm").rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        try:
            out[str(p.relative_to(root))] = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            pass
    return out


def _good(s: str) -> bool:
    t = s.strip()
    return bool(t) and not t.startswith(("#", '"', "'", "@")) and t not in (")", "]", "}", "):", "else:", "try:")


def _note(anchor: str, name: str) -> str:
    last = [ln for ln in anchor.split("\n") if ln.strip()][-1]
    return anchor + last[: len(last) - len(last.lstrip())] + f"# stack: {name}\n"


#: A distinctive line (for :func:`_unique_here`): long enough to say where code is.
_KEY_LEN = 8


@lru_cache(maxsize=4)
def _line_files(version: str) -> dict[str, int]:
    """Stripped line -> number of pin files holding it (the boilerplate test of :func:`_unique_here`)."""
    from collections import Counter

    got: Counter = Counter()
    for text in texts(version).values():
        got.update({s.strip() for s in text.split("\n")})
    return dict(got)


@lru_cache(maxsize=4)
def _stripped(version: str) -> dict[str, str]:
    return {rel: "\n".join(s.strip() for s in t.split("\n")) for rel, t in texts(version).items()}


def _unique_here(win: list[str], rel: str, pin: dict[str, str], counts: dict[str, int], stripped: dict[str, str],
                 cand_stripped: dict[str, str] | None = None) -> bool:
    """The window has one true place on the pin tree, so its truth on a later release is one place too.

    Boilerplate (a model's ``load_weights`` loop, an ``__init__`` copied
    across dozens of model files) has no single destination: which copy is
    "the" one is a coin toss for any oracle. Rejected:

    * a window whose stripped text occurs in any other pin file (indentation ignored);
    * a window where fewer than half of its distinctive lines are unique to its file;
    * a window whose stripped text occurs in several files of the candidate
      (a file vendored twice: the truth would be a pick among copies).
    """
    keys = [s.strip() for s in win if len(s.strip()) >= _KEY_LEN]
    if not keys:
        return False
    if sum(1 for k in keys if counts.get(k, 0) <= 1) * 2 < len(keys):
        return False
    norm = "\n".join(s.strip() for s in win)
    first = min(keys, key=lambda k: counts.get(k, 0))  # rarest line: only files holding it can hold the window
    for other, text in stripped.items():
        if other != rel and first in text and norm in text:
            return False
    if cand_stripped is not None:
        holders = 0
        for text in cand_stripped.values():
            if first in text and norm in text:
                holders += 1
                if holders > 1:
                    return False
    return True


def generate(pin: dict[str, str], cand: dict[str, str], n_patches: int = 260, seed: int = 11,
             pin_version: str | None = None) -> list[Patch]:
    """``n_patches`` patches of 1-3 real pin windows each; about DRIFT_SHARE of the edits drift or lose their file.

    Every anchor is unique across the whole pin tree (:func:`_unique_here`),
    so the labelled truth is one place, not a pick among sibling copies.
    """
    rng = random.Random(seed)
    cand_stripped = {rel: "\n".join(s.strip() for s in t.split("\n")) for rel, t in cand.items()}
    if pin_version is not None:
        counts, stripped = _line_files(pin_version), _stripped(pin_version)
    else:
        from collections import Counter

        c: Counter = Counter()
        for text in pin.values():
            c.update({s.strip() for s in text.split("\n")})
        counts = dict(c)
        stripped = {rel: "\n".join(s.strip() for s in t.split("\n")) for rel, t in pin.items()}
    pools = []
    for prefix, weight in HOT:
        files = sorted(r for r in pin if r.startswith(prefix) and 150 < pin[r].count("\n") < 9000)
        if files:
            pools.append((files, weight))
    used: dict[str, list[tuple[int, int]]] = {}
    want_drift = int(round(DRIFT_SHARE * n_patches * 2))
    n_drift = n_keep = 0
    patches: list[Patch] = []
    tries = 0
    while len(patches) < n_patches and tries < 200 * n_patches:
        tries += 1
        files, _ = rng.choices(pools, weights=[w for _, w in pools])[0]
        rel = rng.choice(files)
        lines = pin[rel].split("\n")
        edits: list[Edit] = []
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            for _attempt in range(30):
                n = rng.choice((2, 3, 3, 4, 5, 6))
                i = rng.randrange(0, max(1, len(lines) - n))
                win = lines[i:i + n]
                if len(win) < n or not all(_good(x) for x in win) or max(len(x.strip()) for x in win) < 24:
                    continue
                if any(i - 3 < b and a < i + n + 3 for a, b in used.get(rel, [])):
                    continue
                anchor = "\n".join(win) + "\n"
                if pin[rel].count(anchor) != 1 or not _unique_here(win, rel, pin, counts, stripped, cand_stripped):
                    continue
                ctext = cand.get(rel)
                drifts = ctext is None or anchor not in ctext
                if ctext is not None and ctext.count(anchor) > 1:
                    continue
                # Keep the mix: drifted edits until the quota is met, survivors for the rest.
                if drifts and n_drift >= want_drift:
                    continue
                if not drifts and n_keep >= 2 * n_patches - want_drift:
                    continue
                used.setdefault(rel, []).append((i, i + n))
                name = f"e{len(patches)}_{len(edits)}"
                edits.append(Edit(name=name, anchor=anchor, replacement=_note(anchor, name)))
                n_drift += drifts
                n_keep += not drifts
                break
        if edits:
            patches.append(Patch(id=f"PS{len(patches) + 1:03d}", title=f"local change to {rel.rsplit('/', 1)[-1]}",
                                 files=[FileEdits(path=rel, edits=edits)]))
    return patches


def write(patches: list[Patch], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.toml"):
        old.unlink()
    for p in patches:
        (dest / f"{p.id}.toml").write_text(dumps_patch(p), encoding="utf-8")


# ----------------------------------------------------------------------------- truth (difflib only)


def direct_truth(anchor: str, file: str, pin_v: str, cand_v: str):
    """(file, first, last line) on the candidate by one difflib comparison; None when it vanished."""
    return true_location(anchor, file, texts(pin_v), texts(cand_v))


def hop_truth(anchor: str, file: str, versions: list[str]):
    """The anchor followed release by release with the difflib oracle; None when any hop loses it.

    Returns (file, first, last line) on the last version and the path
    [(version, file, line), ...].
    """
    cur, rel = anchor, file
    path: list[tuple[str, str, int | None]] = [(versions[0], file, None)]  # the pin's line is not needed
    for a, b in zip(versions, versions[1:]):
        ta, tb = texts(a), texts(b)
        got = tb.get(rel)
        if got is not None and got.count(cur) == 1:
            line = got[:got.find(cur)].count("\n") + 1
            path.append((b, rel, line))
            continue
        t = true_location(cur, rel, ta, tb)
        if t is None:
            return None, path
        rel, lo, hi = t
        cur = "\n".join(tb[rel].split("\n")[lo - 1:hi]) + "\n"
        path.append((b, rel, lo))
    lines = cur.rstrip("\n").split("\n")
    _, last_file, first = path[-1]
    if first is None:  # only the pin's entry: no hop was made
        raise ValueError(f"hop_truth needs two versions or more, got {versions}")
    return (last_file, first, first + len(lines) - 1), path


def label(anchor: str, file: str, versions: list[str]):
    """The labelled truth of one case: ``(kind, (file, first, last) or None, path)``.

    Both difflib oracles are asked, the direct one (pin -> candidate) and the
    hop one (release by release). ``kind`` is:

    * ``"found"``: at least one finds it and they do not disagree (the hop
      oracle's place when it has one: it follows moves the direct one cannot
      see; the direct one's when the hop oracle lost it on the way);
    * ``"vanished"``: neither finds it (no cluster of its distinctive lines
      survives verbatim);
    * ``"ambiguous"``: they find different places; the case is left out of
      the precision figures (and counted).
    """
    hop, path = hop_truth(anchor, file, versions)
    direct = direct_truth(anchor, file, versions[0], versions[-1])
    if hop is None and direct is None:
        return "vanished", None, path
    if hop is not None and direct is not None:
        if hop[0] != direct[0] or hop[2] < direct[1] or direct[2] < hop[1]:
            return "ambiguous", hop, path
    return "found", hop or direct, path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pin", default="0.24.0")
    ap.add_argument("--candidate", default="0.32.0")
    ap.add_argument("--patches", type=int, default=260)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    pin, cand = texts(args.pin), texts(args.candidate)
    patches = generate(pin, cand, args.patches, args.seed, pin_version=args.pin)
    write(patches, Path(args.out))
    edits = [(p.files[0].path, e) for p in patches for e in p.files[0].edits]
    missing = sum(1 for rel, _ in edits if rel not in cand)
    drifted = sum(1 for rel, e in edits if rel in cand and e.anchor not in cand[rel])
    print(f"{len(patches)} patches, {len(edits)} edits: {drifted} drifted, {missing} file_missing, "
          f"{len(edits) - drifted - missing} apply on {args.candidate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
