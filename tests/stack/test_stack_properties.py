"""Hypothesis (issue 16): random stacks of non-conflicting edits in random ``after`` orders.

Each stack: patches on distinct lines of one file (insert after, insert before, rewrite),
some followed by a stacked patch (``after = [it]``) that anchors on the line it produced,
random extra ``after`` edges consistent with a random topological order, and the patch
files in a random set order. Through the real apply/revert (disk, journal, ledger):

* apply + revert is the identity (byte-exact);
* apply twice == apply once (the second writes nothing, the bytes do not move);
* the result does not depend on the set order (only on the declared ordering).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sndr.apply import run_apply, run_revert
from sndr.load import PatchSet
from sndr.locate import find_all
from sndr.model import Patch

REL = "vllm/data/stack.txt"  # not .py: the property is about bytes, not about Python


def _tree(text: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix="sndr-stackprop-"))
    (root / "vllm" / "data").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "version.py").write_text('__version__ = "0.32.0"\n')
    (root / REL).write_text(text)
    return root


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".sndr" not in p.parts}


@st.composite
def stacks(draw):
    n = draw(st.integers(6, 24))
    lines = [f"value_{i} = {i * 7}\n" for i in range(n)]
    text = "".join(lines)
    chosen = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=min(7, n), unique=True))
    specs = []  # (id, anchor, replacement, after)
    for j, i in enumerate(chosen):
        line = lines[i]
        kind = draw(st.sampled_from(["after", "before", "rewrite"]))
        pid = f"R{j}"
        produced = f"# {pid} produced\n"
        if kind == "after":
            repl = line + produced
        elif kind == "before":
            repl = produced + line
        else:
            repl = line.replace(" = ", " = 1000 + ", 1) + produced
        specs.append([pid, line, repl, []])
        depth = draw(st.integers(0, 2))
        prev, prev_line = pid, produced
        for k in range(depth):  # stacked: anchors on what the previous one produced
            sid = f"{pid}S{k}"
            nxt = f"# {sid} stacked on {prev}\n"
            specs.append([sid, prev_line, prev_line + nxt, [prev]])
            prev, prev_line = sid, nxt
    # Random extra `after` edges, consistent with a random topological order of the patches.
    ids = [s[0] for s in specs]
    topo = draw(st.permutations(ids))
    rank = {pid: r for r, pid in enumerate(topo)}
    for s in specs:  # keep the stacking edges satisfiable: a stacked patch must rank after its base
        for base in s[3]:
            if rank[base] > rank[s[0]]:
                rank[base], rank[s[0]] = rank[s[0]], rank[base]
    for s in specs:
        extra = draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))
        s[3] = sorted(set(s[3]) | {e for e in extra if rank[e] < rank[s[0]] and e not in s[3]})
    # A stacked chain must also be acyclic after the swap above: re-check by a topological pass.
    order1 = draw(st.permutations(list(range(len(specs)))))
    order2 = draw(st.permutations(list(range(len(specs)))))
    return text, specs, order1, order2


def _patch_set(specs, order) -> PatchSet:
    patches = []
    for idx in order:
        pid, anchor, repl, after = specs[idx]
        patches.append(Patch.model_validate({"id": pid, "title": pid, "after": after,
                                             "files": [{"path": REL, "edits": [
                                                 {"name": "e", "anchor": anchor, "replacement": repl}]}]}))
    return PatchSet(patches=patches)


def _acyclic(specs) -> bool:
    graph = {s[0]: set(s[3]) for s in specs}
    seen: set[str] = set()
    while graph:
        ready = [k for k, v in graph.items() if v <= seen]
        if not ready:
            return False
        for k in ready:
            seen.add(k)
            del graph[k]
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
def test_random_stacks_apply_revert_identity_idempotent_and_order_free(data):
    text, specs, order1, order2 = data
    if not _acyclic(specs):
        return  # the swap made a cycle: not a valid stack (load would refuse it with requires_cycle)
    for _, anchor, _, _ in specs:
        assert len(find_all(text, anchor)) <= 1  # each base anchor is unique in the pristine file
    a, b = _tree(text), _tree(text)
    pristine = _digest(a)
    r1 = run_apply(a, _patch_set(specs, order1), environ={})
    assert r1.exit_code == 0, [p.render() for p in r1.problems]
    once = (a / REL).read_bytes()
    r2 = run_apply(a, _patch_set(specs, order1), environ={})
    assert r2.exit_code == 0 and r2.files_written == [] and (a / REL).read_bytes() == once
    # Another set order, same declared ordering: the same bytes.
    assert run_apply(b, _patch_set(specs, order2), environ={}).exit_code == 0
    assert (b / REL).read_bytes() == once
    for spec in specs:  # every patch's mark is there exactly once
        assert once.decode().count(spec[2].splitlines()[-1] + "\n") >= 1
    assert run_revert(a).exit_code == 0 and _digest(a) == pristine
    assert run_revert(b).exit_code == 0 and _digest(b) == pristine
