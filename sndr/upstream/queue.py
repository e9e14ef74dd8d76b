"""Planning the port queue of an upstream range: ``sync plan``.

``plan_queue(repo, FROM, TO, surface, tree)`` lists the commits of ``FROM..TO``
(``git log`` semantics: reachable from TO and not from FROM, so a pin and a
target on different release branches work; the merge-base is reported), keeps
those that touch the mirrored surface, and re-derives what each one is for
the current tree (:mod:`sndr.upstream.judge`).

Commits are simulated in upstream order on an in-memory copy of the tree, so a
commit that builds on an earlier applicable one is judged after it. Two passes
keep that honest:

1. **Upstream only.** Line ownership through the range gives the dependency
   graph (:mod:`sndr.upstream.lines`). Revert pairs and chains inside the range
   resolve to their net effect (:mod:`sndr.upstream.reverts`); lines added and
   removed again inside the range are net-zero; a by-hand commit whose lines a
   later commit rewrote is superseded. Commits with the patch-id of a commit on
   the pin's side (a cherry-pick onto the pin's release branch) are satisfied;
   a 3-way pick there (another patch-id; found by ``cherry picked from
   commit``, the PR number or the subject) counts as cherry-picked too.
2. **Against the tree.** Each commit is classified on the simulated tree. The
   halves of a cancelled pair, net-zero and cherry-picked commits are judged
   but never applied, so the simulation never carries a change the port will
   not make.

The surface follows renames inside the range both ways: a file renamed onto
the surface brings the commits to its old path with it, and a surface file
renamed away keeps being mirrored under its new name.

The queue is the applicable, review and conflicting commits, in waves: a
commit sits one wave after the latest commit it depends on. A by-hand commit
whose failing hunks all stand on lines a queued by-hand commit adds is
``blocked by`` that one (counted apart: it applies once that one is ported).
The tree is checked to be the pin first (:mod:`sndr.upstream.treecheck`). Kept decisions
(:mod:`sndr.upstream.decisions`) are attached by sha and shown apart.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import Problem, SndrError, bad_input
from .decisions import Decisions, deviation_set
from .defaults import SYNC_CONFIG_NAME  # its one home: stdlib only, read by the parser
from .diff import parse_hunks
from .gitio import CommitInfo, Git
from .judge import LocalMarks, SimTree, aggregate, classify_change, commit_reason, distinctive, tree_reader
from .lines import LineTracker, net_zero, superseded
from .report import QUEUED, CommitEntry, DeviationHit, QueueReport, SurfaceInfo, Wave
from .reverts import pair_reverts, pr_numbers, strip_pr
from .treecheck import check_tree

__all__ = ["SYNC_CONFIG_NAME", "Surface", "load_sync_config", "patch_surface", "plan_queue"]



def patch_surface(patches: Iterable) -> set[str]:
    """Files the patch set touches: text edits' files and runtime targets' modules."""
    out: set[str] = set()
    for p in patches:
        if getattr(p, "lifecycle", "active") == "retired":
            continue
        for f in getattr(p, "files", []) or []:
            out.add(f.path)
        for r in getattr(p, "runtime", []) or []:
            mod = r.target.split(":", 1)[0].replace(".", "/")
            out.update({f"{mod}.py", f"{mod}/__init__.py"})
    return out


@dataclass
class Surface:
    files: set[str] = field(default_factory=set)
    globs: list[str] = field(default_factory=list)

    def matches(self, path: str | None) -> bool:
        if not path:
            return False
        return path in self.files or any(fnmatch.fnmatchcase(path, g) for g in self.globs)


def _rename_closure(surface: Surface, changes: dict[str, list]) -> tuple[set[str], list[str]]:
    """Paths connected to the surface by a rename inside the range, in either direction."""
    parent: dict[str, str] = {}

    def find(p: str) -> str:
        while parent.get(p, p) != p:
            parent[p] = parent.get(parent[p], parent[p])
            p = parent[p]
        return p

    renames = []
    for chs in changes.values():
        for ch in chs:
            if ch.kind == "R" and ch.old_path:
                renames.append((ch.old_path, ch.path))
                parent.setdefault(ch.old_path, ch.old_path)
                parent.setdefault(ch.path, ch.path)
                parent[find(ch.old_path)] = find(ch.path)
    on = {find(p) for p in parent if surface.matches(p)}
    extra = {p for p in parent if find(p) in on and not surface.matches(p)}
    shown = sorted({f"{a} -> {b}" for a, b in renames if find(a) in on and not (surface.matches(a) and surface.matches(b))})
    return extra, shown


def load_sync_config(path: Path) -> list[str]:
    import tomllib

    from ..load import TOML_LINE, key_line  # the patch files' reader: the same line rules

    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise bad_input("not_found", "sync config does not exist", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        m = TOML_LINE.search(str(exc))
        raise bad_input("toml_syntax", f"malformed TOML: {exc}", file=str(path),
                        line=int(m.group(1)) if m else None) from None
    unknown = sorted(set(data) - {"surface"})
    if unknown:
        raise bad_input("bad_sync_config", f"unknown key {unknown[0]!r}", file=str(path), key=unknown[0],
                        line=key_line(text, (unknown[0],)))
    globs = data.get("surface", [])
    if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
        raise bad_input("bad_sync_config", "'surface' must be a list of glob strings", file=str(path), key="surface",
                        line=key_line(text, ("surface",)))
    return globs




# ----------------------------------------------------------------------------- planning


def _count_lines(data: bytes | None) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


@dataclass
class _Range:
    base: str
    tip: str
    merge_base: str | None
    from_is_ancestor: bool
    commits: list[CommitInfo]
    merges: list[str]
    pin_side: list[CommitInfo] = field(default_factory=list)


def _range(git: Git, from_ref: str, to_ref: str) -> _Range:
    base = git.resolve(from_ref, "from")
    tip = git.resolve(to_ref, "to")
    mb = git.merge_base(base, tip)
    if mb is None:
        raise bad_input("no_merge_base", f"--from {from_ref} and --to {to_ref} share no history",
                        hint="both must be commits of the same repository (fetch the release tags)")
    if mb == tip and tip != base:
        raise bad_input("backwards_range", f"--to {to_ref} is an ancestor of --from {from_ref}: the range is empty",
                        hint="swap --from and --to: the range is the commits reachable from --to, not from --from")
    all_commits = git.commits(base, tip)
    ancestor = mb == base
    pin_side = [] if ancestor else [c for c in git.commits(tip, base) if len(c.parents) <= 1]
    return _Range(base, tip, mb, ancestor, [c for c in all_commits if len(c.parents) <= 1],
                  [c.sha for c in all_commits if len(c.parents) > 1], pin_side)


def plan_queue(repo: Path | str, from_ref: str, to_ref: str, surface: Surface, tree=None, *,
         select: list[str] | None = None, tree_label: str | None = None, decisions: Decisions | None = None,
         patch_files: dict[str, list[str]] | None = None, decisions_file: str | None = None,
         local: LocalMarks | None = None, pin_version: str | None = None,
         pin_digest: str | None = None) -> QueueReport:
    """Plan the port queue of ``from_ref..to_ref`` against ``tree`` (default: the repo's working tree).

    ``decisions``: kept decisions and deviations to attach; ``patch_files``:
    patch id -> files, for deviations that do not list their paths; ``local``:
    the local patches' lines per file (:func:`sndr.upstream.judge.local_marks`),
    to name the patch next to a hunk; ``pin_version``/``pin_digest``: the pin
    record's, to check that the tree is the pin (:func:`~sndr.upstream.treecheck.check_tree`).
    """
    git = Git(repo)
    try:
        return _plan(git, from_ref, to_ref, surface, tree, select, tree_label, decisions, patch_files or {},
                     decisions_file, local or {}, pin_version, pin_digest)
    finally:
        git.close()


def _three_way_picks(commits: list[CommitInfo], cands: Iterable[int], pin_side: list[CommitInfo],
                     picked: dict[int, str]) -> dict[int, tuple[str, str]]:
    """Commits of the range carried on the pin's side under another patch-id (a 3-way cherry-pick):
    index -> (pin-side sha, how it was found): ``cherry picked from commit`` in the pick's body, the same
    PR number, or the same subject with PR suffixes stripped."""
    import re

    by_origin: dict[str, str] = {}
    by_pr: dict[int, str] = {}
    by_subject: dict[str, str] = {}
    taken = set(picked.values())
    for p in pin_side:
        if p.sha in taken:
            continue
        for m in re.finditer(r"cherry picked from commit ([0-9a-f]{7,40})", p.body):
            by_origin.setdefault(m.group(1), p.sha)
        for n in pr_numbers(p.subject)[-1:]:
            by_pr.setdefault(n, p.sha)
        by_subject.setdefault(strip_pr(p.subject), p.sha)
    out: dict[int, tuple[str, str]] = {}
    for i in cands:
        if i in picked:
            continue
        c = commits[i]
        hit = next((sha for pref, sha in by_origin.items() if c.sha.startswith(pref)), None)
        how = "its body names this commit"
        if hit is None and (nums := pr_numbers(c.subject)[-1:]) and nums[0] in by_pr:
            hit, how = by_pr[nums[0]], f"the same PR #{nums[0]}"
        if hit is None and strip_pr(c.subject) in by_subject and not c.subject.startswith("Revert"):
            hit, how = by_subject[strip_pr(c.subject)], "the same subject"
        if hit is not None:
            out[i] = (hit, how)
    return out


def _plan(git: Git, from_ref, to_ref, surface: Surface, tree, select, tree_label, decisions: Decisions | None,
          patch_files: dict[str, list[str]], decisions_file: str | None, local: LocalMarks,
          pin_version: str | None, pin_digest: str | None) -> QueueReport:
    if tree is None and git.text("rev-parse", "--is-bare-repository").strip() == "true":
        raise bad_input("bare_repo", f"{git.repo} is a bare repository: it has no work tree to judge the commits "
                        "on, so every commit would read as 'file missing in the tree'", file=str(git.repo),
                        key="tree", hint="pass --tree with the pin's tree (e.g. --tree vllm==X, or the installed, "
                        "patched pin)")
    rng = _range(git, from_ref, to_ref)
    work_tree = tree is None
    if tree is None:
        from ..tree import DirTree

        tree = DirTree(git.repo, spec=str(git.repo))
    read = tree_reader(tree)
    listed = {f for rev in (rng.base, rng.tip) for f in git.text("ls-tree", "-r", "--name-only", rev).splitlines()}
    warnings = check_tree(git, rng.base, rng.tip, from_ref, to_ref, tree, sorted(set(surface.files) | {
        f for f in listed if surface.matches(f)}), pin_version, pin_digest, work_tree)
    surface = Surface(set(surface.files), list(surface.globs))
    initial_files = sorted(surface.files)
    commits = rng.commits

    changes = git.all_changes([c.sha for c in commits])
    renamed_paths, renamed_shown = _rename_closure(surface, changes)

    def mirrored_path(p: str | None) -> bool:
        return bool(p) and (surface.matches(p) or p in renamed_paths)

    # pass 1: upstream only
    tracker = LineTracker(lambda rev, path: _count_lines(git.blob(rev, path)))
    deps: dict[int, set[int]] = {}
    for i, c in enumerate(commits):
        chs = changes.get(c.sha, [])
        mirrored = [ch for ch in chs if mirrored_path(ch.path) or mirrored_path(ch.old_path)]
        c.other_files = len(chs) - len(mirrored)
        if not mirrored:
            continue
        for ch in mirrored:
            if ch.kind in ("M", "R", "T"):
                paths = [ch.path] + ([ch.old_path] if ch.old_path else [])
                ch.hunks, ch.binary = parse_hunks(git.diff(c.parent, c.sha, paths))
            elif ch.kind in ("A", "C", "D"):
                ch.binary = b"\0" in ((git.blob(c.sha if ch.kind != "D" else c.parent, ch.path)) or b"")[:8000]
        c.changes = mirrored

        def new_count(p: str, sha: str = c.sha) -> int:
            return _count_lines(git.blob(sha, p))

        deps[i] = tracker.commit(i, c.parent, mirrored, new_count)

    # identity: cherry-picks onto the pin's side, duplicates inside the range, reverts
    surface_shas = [commits[i].sha for i in sorted(deps)]
    forward = git.patch_ids(surface_shas + [c.sha for c in rng.pin_side])
    pin_ids = {forward[c.sha]: c.sha for c in rng.pin_side if c.sha in forward}
    inverse = git.patch_ids(surface_shas, inverse=True)
    rv = pair_reverts(commits, set(deps), forward, inverse)
    # A pair found by its subject, body or PR whose revert is not the exact inverse of the original (patch-id:
    # the revert changes more, or other lines, than it undoes) does not cancel: cancelling both would drop
    # the difference from the queue unsaid. Both stay ordinary commits (the original simulated, the revert on
    # it), each flagged with the other.
    inexact = {a: b for a, b in rv.partner.items() if a not in rv.chain and b not in rv.chain
               and inverse.get(commits[max(a, b)].sha) != forward.get(commits[min(a, b)].sha)}
    partner = {a: b for a, b in rv.partner.items() if a not in inexact}
    picked: dict[int, str] = {}
    dup_of: dict[int, int] = {}
    first_with: dict[str, int] = {}
    for i in sorted(deps):
        pid = forward.get(commits[i].sha)
        if not pid:
            continue
        if pid in pin_ids:
            picked[i] = pin_ids[pid]
        elif pid in first_with and i not in rv.target and first_with[pid] not in partner:
            dup_of[i] = first_with[pid]  # a revert of a revert re-applies, it does not duplicate
        else:
            first_with.setdefault(pid, i)
    for i, what in list(rv.outside.items()):
        if what.startswith('"'):  # a subject: find the reverted commit in the pin's history
            sha = git.find_subject(rng.base, what[1:-1])
            if sha:
                rv.outside[i] = sha
            elif i in rv.unquoted:  # ``Revert X`` that names nothing: a subject that starts with the word
                del rv.outside[i]
        elif len(what) < 40:  # ``This reverts commit <prefix>``: the full sha of the pin's side
            proc = git.run("rev-parse", "--verify", "--quiet", f"{what}^{{commit}}", check=False)
            if proc.returncode == 0:
                rv.outside[i] = proc.stdout.decode().strip()
    picked3 = _three_way_picks(commits, sorted(deps), rng.pin_side, picked)
    for a in [a for a in partner if a in picked or a in picked3]:
        # the pin carries a cherry-pick of the original: the revert inside the range is real work
        b = partner.pop(a)
        partner.pop(b, None)
    zero, zero_flags = net_zero(tracker, deps.keys(), set(partner) | set(picked) | set(picked3))
    later = superseded(tracker, deps.keys())

    # pass 2: against the tree
    sim = SimTree(read)
    entries: list[CommitEntry] = []
    findings: list[Problem] = []
    for i, c in enumerate(commits):
        if i not in deps:
            entries.append(CommitEntry(sha=c.sha, subject=c.subject, position=i + 1, disposition="outside",
                                       status="skip", other_files=c.other_files,
                                       reason=f"touches no mirrored file ({c.other_files} file"
                                       f"{'s' if c.other_files != 1 else ''})"))
            continue
        work = sim.fork()
        results = [classify_change(work, ch, git.blob, c.sha, c.parent, local) for ch in c.changes]
        disp = aggregate([r.disposition for r in results])
        entry = CommitEntry(sha=c.sha, subject=c.subject, position=i + 1, disposition=disp,
                            status="skip" if disp == "satisfied" else ("port" if disp == "applicable" else "port-by-hand"),
                            reason=commit_reason(results), files=results, other_files=c.other_files)
        if i in rv.outside:
            what = rv.outside[i]
            entry.reverts = what
            entry.flags.append(f"reverts {what if what.startswith(chr(34)) else what[:10]} (outside the range)")
        if i in rv.relands:  # a revert of a revert, or the reverted title again: a re-land, not a revert
            orig, undone = rv.relands[i]
            entry.relands = commits[orig].sha
            entry.flags.append(f"re-lands {commits[orig].short} after its revert {commits[undone].short} "
                               f"({rv.reland_how[i]})")
        elif i in rv.target:
            entry.reverts = commits[rv.target[i]].sha
            entry.flags.append(f"reverts {commits[rv.target[i]].short} (paired by {rv.how[i]})")
        elif i in rv.title_reuse:
            entry.flags.append(f"carries the title of {commits[rv.title_reuse[i]].short}, reverted before it, but "
                               "touches none of its files: not treated as its re-land")
        if i in rv.again:
            entry.flags.append(f"reverts {commits[rv.target[i]].short} again (already reverted by "
                               f"{commits[rv.again[i]].short})")
        near = sorted({p for r in results for h in r.hunks for p in h.local_patches})
        if near:
            entry.flags.append(f"next to local patch {', '.join(near)}")
        if i in picked:
            entry.cherry_pick_of = picked[i]
            entry.disposition, entry.status = "satisfied", "skip"
            entry.reason = f"cherry-picked onto the pin's side as {picked[i][:10]} (same patch-id)"
        elif i in picked3:
            sha3, how3 = picked3[i]
            entry.cherry_pick_of = sha3
            if disp == "satisfied":
                entry.reason = (f"cherry-picked onto the pin's side as {sha3[:10]} (a 3-way pick: another patch-id, "
                                f"{how3}); its content is in the tree")
            else:
                entry.flags.append(f"cherry-picked onto the pin's side as {sha3[:10]} (a 3-way pick: another "
                                   f"patch-id, {how3}), but the tree differs from it here")
        elif i in dup_of and entries[dup_of[i]].status not in ("outside",):
            entry.cherry_pick_of = commits[dup_of[i]].sha
            entry.flags.append(f"same patch-id as {commits[dup_of[i]].short} earlier in the range")
            if entry.status in QUEUED and entries[dup_of[i]].status in QUEUED:
                entry.status = "skip"
                entry.reason = f"the same change as {commits[dup_of[i]].short} (same patch-id): port it once"
        if disp == "applicable" and i not in partner and i not in zero and i not in picked:
            sim = work
        entries.append(entry)

    for a, b in inexact.items():
        entries[a].flags.append(f"revert pair with {commits[b].sha[:10]}, but not an exact inverse (patch-id): the "
                                f"revert changes more than it undoes, so neither cancels; both stay queued, in order")
    # ordering rules: revert pairs and chains
    for a, b in partner.items():
        if a > b:
            continue
        ea, eb = entries[a], entries[b]
        ea.pair, eb.pair = eb.sha, ea.sha
        # b undoes a: a revert of it, or (a being a revert) a re-land of what a reverted
        kind, undo = "revert pair", f"{eb.sha[:10]} reverts {ea.sha[:10]}"
        if b in rv.relands:
            kind, undo = "revert and re-land pair", (f"{eb.sha[:10]} re-lands {commits[rv.relands[b][0]].short} "
                                                     f"over its revert {ea.sha[:10]}")
        chain = rv.chain.get(a)
        net = ""
        if chain:
            root = entries[chain[0]]
            stands = len(chain) % 2 == 1
            net = (f"; revert chain of {len(chain)} ({' -> '.join(entries[k].sha[:10] for k in chain)}) nets out to "
                   + (f"{root.sha[:10]} standing" if stands else "nothing"))
        if ea.disposition == "satisfied" and eb.disposition != "satisfied" and a not in picked and a not in picked3:
            for e, other in ((ea, eb), (eb, ea)):
                e.status = "refused"
                e.reason = (f"{kind} with {other.sha[:10]}: the tree already carries {ea.sha[:10]}, and {undo} "
                            f"inside the range; porting one half alone is refused{net}")
            findings.append(Problem("revert_pair_half_ported",
                                    f"{undo} inside the range, but the tree already "
                                    f"carries {ea.sha[:10]}: decide by hand (drop it locally or keep it as a patch)"))
        else:
            for e, other in ((ea, eb), (eb, ea)):
                if e.status == "skip" and e.cherry_pick_of:
                    continue
                e.status = "cancelled"
                e.reason = (f"{kind} with {other.sha[:10]} inside the range: they cancel out{net}" if b not in rv.relands
                            else f"{kind} with {other.sha[:10]}: {undo} inside the range; they cancel out{net}")
    for k, chain in rv.chain.items():
        if k == chain[0] and len(chain) % 2 == 1 and entries[k].status not in ("cancelled", "refused"):
            entries[k].flags.append(f"revert chain of {len(chain)} nets out to this commit standing")
    for k in sorted(zero):
        e = entries[k]
        e.status = "net-zero"
        e.flags.append("net-zero")
        if k in zero_flags:
            e.reason = ("add-then-remove: every line it adds is removed again by "
                        + ", ".join(entries[r].sha[:10] for r in sorted(zero_flags[k])))
        else:
            adders = sorted({o for o in tracker.removed_origins.get(k, []) if o is not None})
            e.reason = "add-then-remove: removes only lines added inside the range by " + \
                ", ".join(entries[a].sha[:10] for a in adders)
    for j in sorted(set(zero_flags) - zero):
        removers = [r for r in sorted(zero_flags[j]) if entries[r].status != "cancelled"]
        if removers:  # a remover cancelled by its re-land (or its own revert) removes nothing in the end
            entries[j].flags.append("net-zero lines: every line it adds is removed again by "
                                    + ", ".join(entries[r].sha[:10] for r in removers))
    for j, by in sorted(later.items()):
        e = entries[j]
        if e.status == "port-by-hand" and by:
            e.status = "superseded"
            e.superseded_by = [entries[k].sha for k in by]
            e.reason = (f"superseded by {', '.join(entries[k].sha[:10] for k in by)}: every line it adds is "
                        f"rewritten later in the range; port the later commit instead ({e.reason})")

    queued = {i for i, e in enumerate(entries) if e.status in QUEUED}
    by_sha_all = {e.sha: i for i, e in enumerate(entries)}
    for i in sorted(queued):
        entries[i].depends_on = [entries[j].sha for j in sorted(deps.get(i, ())) if j in queued]
        blockers = [j for j in sorted(deps.get(i, ())) if j in queued
                    and entries[j].disposition in ("conflict", "review")]
        if blockers and entries[i].disposition in ("conflict", "review"):
            direct = _blocked_by(commits[i], entries[i], [commits[j] for j in blockers])
            # a blocker that is itself blocked passes on its own: name the commits to port by hand first
            roots = list(dict.fromkeys(r for s in direct for r in (entries[by_sha_all[s]].blocked_by or [s])))
            if roots:
                entries[i].blocked_by = roots
                entries[i].reason = (f"blocked by {', '.join(s[:10] for s in roots)} (by hand): every hunk that "
                                     f"does not apply stands on lines it adds; port it first ({entries[i].reason})")
            else:
                entries[i].reason += (f"; builds on {', '.join(entries[j].sha[:10] for j in blockers)} (by hand): "
                                      "port that first")
    by_sha = {e.sha: i for i, e in enumerate(entries)}

    selected_idx: set[int] | None = None
    if select:
        selected_idx = _select(entries, by_sha, select)
        warnings += [f"--select {entries[i].sha[:10]} ({entries[i].subject!r}) queues nothing: it is "
                     f"{entries[i].status} ({entries[i].reason})" for i in sorted(selected_idx - queued)]
        queued &= selected_idx

    wave_of: dict[int, int] = {}
    for i in sorted(queued):
        wave_of[i] = 1 + max((wave_of[j] for j in deps.get(i, ()) if j in wave_of), default=0)
        entries[i].wave = wave_of[i]
    waves = [Wave(number=n, commits=[entries[i].sha for i in sorted(wave_of) if wave_of[i] == n])
             for n in range(1, max(wave_of.values(), default=0) + 1)]

    # kept decisions and deviations
    stale: list[str] = []
    hits: list[DeviationHit] = []
    checked = [d.patch for d in decisions.deviations] if decisions is not None else []
    if decisions is not None:
        for d in decisions.decisions:
            matched = [e for e in entries if d.matches(e.sha)]
            for e in matched:
                e.decision = d
            if not matched:
                stale.append(d.sha)
        for dev, paths in deviation_set(decisions, patch_files):
            touched = [e for e, c in zip(entries, commits)
                       if any(ch.path in paths or ch.old_path in paths for ch in changes.get(c.sha, []))]
            discharge = next((c.sha for c in commits if dev.discharged_by(c.sha, c.subject)), None)
            for e in touched:
                e.deviations.append(dev.patch)
                e.flags.append(f"touches deviation {dev.patch}" + (f" ({dev.upstream})" if dev.upstream else "")
                               + (f"; discharged by {discharge[:10]}" if discharge else ""))
            if touched or discharge:
                hits.append(DeviationHit(patch=dev.patch, upstream=dev.upstream, why=dev.why, paths=paths,
                                         touched_by=[e.sha for e in touched], discharge=dev.discharge,
                                         discharge_in_range=discharge, reviewed=dev.reviewed))

    counts: dict[str, int] = {"commits": len(commits), "mirrored": len(deps), "merges_skipped": len(rng.merges),
                              "pin_side": len(rng.pin_side), "cherry_picked": len(picked) + len(picked3),
                              "cherry_picked_3way": len(picked3),
                              "reverts_paired": len(set(rv.target) - set(rv.relands)),
                              "reverts_outside": len(rv.outside), "relands": len(rv.relands)}
    for e in entries:
        counts[e.disposition] = counts.get(e.disposition, 0) + 1
        counts[f"status:{e.status}"] = counts.get(f"status:{e.status}", 0) + 1
    counts["blocked"] = sum(1 for i in queued if entries[i].blocked_by)
    counts["queued"] = len(queued)
    counts["decided"] = sum(1 for i in queued if entries[i].decided)
    counts["undecided"] = len(queued) - counts["decided"]
    return QueueReport(repo=str(git.repo), from_ref=from_ref, from_sha=rng.base, to_ref=to_ref, to_sha=rng.tip,
                       merge_base=rng.merge_base, from_is_ancestor=rng.from_is_ancestor,
                       pin_side=[c.sha for c in rng.pin_side],
                       tree=tree_label or getattr(tree, "spec", None) or str(tree),
                       surface=SurfaceInfo(files=initial_files, globs=list(surface.globs), renamed=renamed_shown),
                       decisions_file=decisions_file, counts=counts, waves=waves, commits=entries,
                       merges_skipped=rng.merges,
                       selected=sorted(entries[i].sha for i in selected_idx) if selected_idx is not None else None,
                       deviations=hits, deviations_checked=checked, stale_decisions=stale, findings=[p.to_json() for p in findings],
                       warnings=warnings)


def _blocked_by(c: CommitInfo, e: CommitEntry, blockers: list[CommitInfo]) -> list[str]:
    """The by-hand commits whose added lines every failing hunk of ``c`` stands on (empty when some failing
    hunk does not): ``c`` applies once they are ported."""
    added = {b.sha: {s for ch in b.changes for h in ch.hunks for tag, t in h.lines
                     if tag == "+" and distinctive(s := t.strip())} for b in blockers}
    by: list[str] = []
    failing = 0
    for ch, fr in zip(c.changes, e.files):
        if fr.disposition in ("conflict", "review") and not fr.hunks:
            return []  # a whole-file conflict (missing, added twice, a binary): no line to stand on
        for h, hr in zip(ch.hunks, fr.hunks):
            if hr.disposition not in ("conflict", "review"):
                continue
            failing += 1
            pre = {s for t in h.pre_lines if distinctive(s := t.strip())}
            on = [sha for sha, lines in added.items() if pre & lines]
            if not on:
                return []
            by += [sha for sha in on if sha not in by]
    return by if failing else []


def _select(entries: list[CommitEntry], by_sha: dict[str, int], select: list[str]) -> set[int]:
    chosen: set[int] = set()
    for s in select:
        hits = [e.sha for e in entries if e.sha.startswith(s.strip())]
        if len(hits) != 1:
            raise bad_input("bad_select", f"--select {s!r} names {'no' if not hits else 'more than one'} "
                            "commit in the range", key="select")
        e = entries[by_sha[hits[0]]]
        if e.disposition == "outside":
            raise bad_input("bad_select", f"--select {s.strip()!r} names {e.sha[:10]} ({e.subject!r}), which is "
                            f"outside the mirrored surface: it {e.reason}", key="select",
                            hint="add its files with --surface GLOB, or select a commit the queue lists")
        chosen.add(by_sha[hits[0]])
    refusals = []
    for i in sorted(chosen):
        e = entries[i]
        if e.pair and by_sha[e.pair] not in chosen:
            later = max(e, entries[by_sha[e.pair]], key=lambda x: x.position)  # the half that undoes the other
            kind = "revert and re-land pair" if later.relands else "revert pair"
            refusals.append(Problem("revert_pair_split", f"{e.sha[:10]} and {e.pair[:10]} are a {kind} "
                                    "inside the range; porting one half alone is refused",
                                    hint="select both (they cancel) or neither"))
        missing = [d for d in e.depends_on if by_sha[d] not in chosen]
        if missing:
            refusals.append(Problem("series_split", f"{e.sha[:10]} builds on {', '.join(m[:10] for m in missing)}, "
                                    "which is not selected; a series keeps upstream order",
                                    hint="select the earlier commits too"))
    if refusals:
        raise SndrError(refusals)
    return chosen
