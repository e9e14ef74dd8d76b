"""``--via``: follow drifted anchors release by release, for stacks that fell behind.

One direct comparison of the pin with a candidate eight releases later loses
code that moved in one release and was edited in another: neither the old
file nor the old text is there any more. Following the anchor hop by hop
finds it: on each release the anchor is either still there verbatim (its line
is updated), or the hop's best relocation suggestion, when it reaches
``medium`` confidence, becomes the anchor for the next hop (its text, file,
qualname and line). A hop with no confident match ends the chain ("lost").

The chain's result competes with the direct search (see
:func:`pick`): the higher confidence class wins, the chain on a tie.

Every hop's trees are opened once per process and their per-file views are
shared by the hops that touch them (:func:`tree_state`). On disk, content-
addressed under the cache root: each release's line index
(:mod:`.lineindex`, keyed by its tree digest), its files' parsed scopes
(:mod:`sndr.locate`, keyed by file content), and the list of files that
changed between two releases (keyed by both digests). A second run, or a run
with another candidate, reuses every hop's indexes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from .. import env
from ..errors import bad_input
from ..locate import scopes
from .models import Confidence, HopStep
from .snapshot import Snapshot, changed_files
from .suggest import Relocator, Suggestion, anchor_lines

__all__ = ["auto_releases", "resolve_via", "Chain", "Request", "follow", "pick", "tree_state"]

_RANK = {"high": 2, "medium": 1, "low": 0}
_VERSION = re.compile(r"^\d+(\.\d+)*$")


# ----------------------------------------------------------------------------- which releases


def _published_versions() -> list[str]:
    """Versions of vllm on the package index, through pip (the ordinary client)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check", "--no-input"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise bad_input("via_unavailable", f"--via auto: could not ask the package index ({exc})",
                        hint="pass the releases with --via 0.27.0,0.30.0") from None
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise bad_input("via_unavailable", "--via auto: the package index did not list vllm versions"
                        + (f" ({lines[-1]})" if lines else ""), hint="pass the releases with --via 0.27.0,0.30.0")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def _cached_versions() -> list[str]:
    from .. import caches

    trees = caches.dir_path(env.CACHE_TREES, "tree cache", without="no cached release is listed")
    out = []
    if trees is not None:
        for d in trees.iterdir():
            if d.name.startswith("vllm-") and (d / ".complete").is_file():
                out.append(d.name[len("vllm-"):])
    return out


def auto_releases(pin_version: str, cand_version: str, published: list[str] | None = None) -> list[str]:
    """Final releases strictly between the two versions, the last patch release of each minor.

    ``published`` defaults to the package index's list (``pip index versions``);
    with ``SNDR_OFFLINE=1`` it is the set of cached trees.
    """
    from packaging.version import InvalidVersion, Version

    try:
        lo, hi = Version(pin_version), Version(cand_version)
    except InvalidVersion:
        raise bad_input("bad_via", f"--via auto needs released versions on both ends (got {pin_version} -> "
                        f"{cand_version})", hint="pass the releases with --via") from None
    if published is None:
        published = _cached_versions() if env.env_flag(env.OFFLINE) else _published_versions()
    best: dict[tuple[int, int], Version] = {}
    for text in published:
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if v.is_prerelease or v.is_devrelease or not (lo < v < hi):
            continue
        key = (v.major, v.minor)
        if (key[0], key[1]) == (lo.major, lo.minor) or (key[0], key[1]) == (hi.major, hi.minor):
            continue  # a patch release of either end is not a step in between
        if key not in best or v > best[key]:
            best[key] = v
    return [str(best[k]) for k in sorted(best)]


def resolve_via(via, pin_version: str, cand_version: str) -> list[str]:
    """Tree specs for ``--via``: ``"auto"`` or a list of versions / tree specs, checked to lie in between."""
    from packaging.version import InvalidVersion, Version

    items = auto_releases(pin_version, cand_version) if via == "auto" else list(via)
    specs = []
    prev: Version | None = None
    for item in items:
        spec = f"vllm=={item}" if _VERSION.match(item) else item
        if _VERSION.match(item):  # a tree spec's version is known once it is opened: Chain.build checks it
            try:
                Version(item)
            except InvalidVersion:
                prev = None
            else:
                prev = check_between(item, item, prev, pin_version, cand_version)
        specs.append(spec)
    return specs


def check_between(label: str, version: str, prev, pin_version: str, cand_version: str):
    """``bad_via`` unless ``version`` (of the hop ``label`` names) lies strictly between the pin and the
    candidate and after the hop before it (``prev``); returns it as a Version for the next hop's check."""
    from packaging.version import InvalidVersion, Version

    try:
        v, lo, hi = Version(version), Version(pin_version), Version(cand_version)
    except InvalidVersion:
        raise bad_input("bad_via", f"--via {label}: its vLLM version {version!r} is not a version", key="--via") \
            from None
    if not (lo < v < hi and (prev is None or prev < v)):
        what = label if label == version else f"{label} (vLLM {version})"
        raise bad_input("bad_via", f"--via {what}: not between {pin_version} and {cand_version} in order",
                        key="--via")
    return v


# ----------------------------------------------------------------------------- per-tree state, shared


@dataclass
class _TreeState:
    snapshot: Snapshot
    files: dict = field(default_factory=dict)  # rel -> suggest._File (token sets, windows)
    _index: object = None

    @property
    def index(self):
        """The tree's line index (on disk, content-addressed; None when no cache can hold it)."""
        if self._index is None:
            from .lineindex import for_snapshot

            self._index = for_snapshot(self.snapshot) or False
        return self._index or None


_STATES: dict[str, _TreeState] = {}
_MAX_STATES = 12


def tree_state(spec) -> _TreeState:
    """One shared, loaded snapshot (and its per-file views) per tree spec in this process."""
    from ..tree import open_tree

    if isinstance(spec, Snapshot):
        # Only published releases (immutable cached trees) are shared between runs.
        if spec.kind != "version" or spec.has_ledger:
            return _TreeState(spec)
        key = spec.spec.replace(" ", "")
        if key not in _STATES:
            _remember(key, _TreeState(spec))
        return _STATES[key]
    key = str(spec).replace(" ", "")
    hit = _STATES.get(key)
    if hit is None:
        snap = Snapshot(open_tree(spec))
        snap.load_all()
        hit = _TreeState(snap)
        if snap.kind == "version" and not snap.has_ledger:
            _remember(key, hit)
    return hit


def _remember(key: str, state: _TreeState) -> None:
    _STATES[key] = state
    while len(_STATES) > _MAX_STATES:
        _STATES.pop(next(iter(_STATES)))


def _changed(a: Snapshot, b: Snapshot) -> list[str]:
    """Candidate files new or changed between two trees; kept on disk per pair of tree digests."""
    from .. import caches

    cache = caches.open_dir(f"{env.CACHE_PREFLIGHT}/changed", "preflight cache", without="changed files are listed again")
    name = f"{a.digest[:20]}-{b.digest[:20]}.json"
    if cache is not None:
        try:
            hit = cache.get_sealed("changed", name)
            got = json.loads(hit) if hit is not None else None
            if isinstance(got, list) and all(isinstance(x, str) for x in got):
                return got
        except ValueError:
            pass
    changed, _ = changed_files(a, b)
    if cache is not None:
        try:
            cache.put_sealed("changed", name, json.dumps(changed).encode())
        except OSError:  # a cache that cannot be written is only slower
            pass
        cache.close()
    return changed


# ----------------------------------------------------------------------------- following anchors


@dataclass
class Request:
    """One anchor to follow: its text and where it sat on the pin."""

    anchor: str
    file: str
    qualname: str | None
    line: int | None


@dataclass
class _State:
    text: str
    file: str
    qualname: str | None
    line: int | None
    scores: list[int] = field(default_factory=list)
    sims: list[int] = field(default_factory=list)  # each relocating hop's similarity
    classes: list[Confidence] = field(default_factory=list)
    last: list[Suggestion] = field(default_factory=list)
    path: list[HopStep] = field(default_factory=list)
    lost: bool = False


@dataclass
class Chain:
    """The releases of a ``--via`` run, pin first, candidate last, and a relocator per hop."""

    states: list[_TreeState]
    relocators: list[Relocator] = field(default_factory=list)

    @classmethod
    def build(cls, pin: Snapshot, via_specs: list[str], cand: Snapshot) -> Chain:
        states = [tree_state(pin), *(tree_state(s) for s in via_specs), tree_state(cand)]
        prev = None
        for spec, st in zip(via_specs, states[1:-1]):  # a tree spec's version, now that it is open
            prev = check_between(spec, st.snapshot.version, prev, pin.version, cand.version)
        chain = cls(states)
        for a, b in zip(states, states[1:]):
            chain.relocators.append(Relocator(a.snapshot.text_or_none, b.snapshot.text_or_none,
                                              _changed(a.snapshot, b.snapshot), files=b.files,
                                              index=b.index))
        return chain

    @property
    def versions(self) -> list[str]:
        return [s.snapshot.version for s in self.states]


def _exact(text: str | None, anchor: str, near: int | None) -> int | None:
    """1-based line of ``anchor`` in ``text`` (the occurrence nearest ``near`` when several)."""
    if text is None or not anchor:
        return None
    pos = text.find(anchor)
    if pos < 0:
        return None
    lines: list[int] = []
    while pos >= 0 and len(lines) < 50:
        lines.append(text.count("\n", 0, pos) + 1)
        pos = text.find(anchor, pos + 1)
    return min(lines, key=lambda ln: (abs(ln - (near or 0)), ln))


def follow(chain: Chain, requests: list[Request]) -> list[_State]:
    """Follow every request through every hop; returns one state per request (path, last suggestions)."""
    states = [_State(r.anchor, r.file, r.qualname, r.line,
                     path=[HopStep(version=chain.versions[0], file=r.file, line=r.line, qualname=r.qualname,
                                   how="pin")]) for r in requests]
    for hop, reloc in enumerate(chain.relocators):
        tree = chain.states[hop + 1].snapshot
        version = tree.version
        moving = []
        for st in states:
            if st.lost:
                continue
            text = tree.text_or_none(st.file)
            line = _exact(text, st.text, st.line)
            if line is not None:
                st.line = line
                st.qualname = scopes(text).qualname(line) if text is not None else st.qualname
                st.path.append(HopStep(version=version, file=st.file, line=line, qualname=st.qualname, how="exact"))
                if hop == len(chain.relocators) - 1:
                    st.last = []
            else:
                moving.append(st)
        reloc.prefetch((st.text, st.file) for st in moving)
        for st in moving:
            found = reloc.suggest(st.text, st.file, qualname=st.qualname, pin_line=st.line)
            top = found[0] if found else None
            if top is None or top.confidence == "low":
                st.lost = True
                st.path.append(HopStep(version=version, file=top.file if top else st.file,
                                       line=top.line if top else None, qualname=top.qualname if top else None,
                                       how="lost", score=top.score if top else None,
                                       confidence=top.confidence if top else None))
                continue
            st.text, st.file, st.qualname, st.line = top.text, top.file, top.qualname or None, top.line
            st.scores.append(top.score)
            st.sims.append(top.similarity)
            st.classes.append(top.confidence)
            st.last = found
            st.path.append(HopStep(version=version, file=top.file, line=top.line, qualname=top.qualname,
                                   how="relocated", score=top.score, confidence=top.confidence))
    return states


def chain_suggestion(chain: Chain, req: Request, st: _State) -> Suggestion | None:
    """The chain's answer on the candidate as one suggestion (None when the chain lost the anchor)."""
    if st.lost:
        return None
    cand = chain.states[-1].snapshot
    if st.last and st.path[-1].how == "relocated":
        top = st.last[0]
    else:
        text = cand.text_or_none(st.file)
        if text is None or st.line is None:
            return None
        n = len(anchor_lines(st.text))
        lines = text.split("\n")[st.line - 1:st.line - 1 + n]
        top = Suggestion(file=st.file, line=st.line, end_line=st.line + n - 1, qualname=st.qualname or "",
                         score=100, similarity=100, text="\n".join(lines) + "\n")
    sim = fuzz.ratio("\n".join(s.strip() for s in anchor_lines(req.anchor)),
                     "\n".join(s.strip() for s in anchor_lines(top.text)))
    score = min(st.scores) if st.scores else top.score
    klass = min(st.classes, key=lambda c: _RANK[c]) if st.classes else "high"
    hops = [f"{p.version} {p.how}" for p in st.path[1:] if p.how != "exact"]
    # The class is earned hop by hop, so the figures shown are the weakest hop's (they meet the class's
    # cut-offs); the anchor's similarity to the final text is a reason, never the figure beside the class.
    shown = min(st.sims) if st.sims else int(round(sim))
    reasons = (f"followed {len(st.path) - 1} releases ({', '.join(hops) or 'unchanged text'})",
               f"weakest hop similarity {shown}, end to end {int(round(sim))}",
               *(r for r in top.reasons if not r.startswith("followed")))
    return Suggestion(file=top.file, line=top.line, end_line=top.end_line, qualname=top.qualname, score=int(score),
                      similarity=shown, reasons=reasons, text=top.text, confidence=klass)


def pick(direct: list[Suggestion], via: Suggestion | None, limit: int = 3) -> tuple[list[Suggestion], str]:
    """Merge the chain's answer with the direct search: the higher confidence first, the chain on a tie."""
    best_direct = _RANK[direct[0].confidence] if direct else -1
    if via is None or _RANK[via.confidence] < best_direct or via.confidence == "low":
        return direct, "direct"
    rest = [s for s in direct if not (s.file == via.file and s.line <= via.end_line and via.line <= s.end_line)]
    return [via, *rest][:limit], "via"
