"""Scripted upstream histories in vLLM's shapes, written with ``git fast-import``.

vLLM's own history cannot be fetched here, so the sync tests and
``benchmarks/bench_sync.py`` build histories that have its shapes:

- squash-merged subjects ``[Tag] Title (#N)``;
- reverts ``Revert "[Tag] Title (#N)" (#M)``, some saying ``Reverts
  vllm-project/vllm#N`` in the body, some silent (only the inverse diff);
- release branches: each release is cut on ``releases/vX.Y`` from main, fixes
  are cherry-picked onto it from main, and the tag sits on the branch, so
  releases are not ancestors of each other;
- renames, pure additions (new functions), rewrites of recent lines.

:class:`History` keeps every branch's files in memory and writes the whole
history through one ``git fast-import`` (thousands of commits in seconds).
:func:`release_history` builds the pin-bump shape on real vLLM files: the
``v0.32.0`` and ``v0.33.0`` tags hold the real 0.32.0 and 0.33.0 files.
:func:`generate` builds a large random history of that shape.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "up@example.invalid",
    "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "up@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}

Edit = tuple[str, str, str]  # (path, old snippet, new snippet); old '' with new: a whole new file


@dataclass
class Commit:
    mark: int
    branch: str
    subject: str
    body: str
    edits: list[Edit]
    renames: list[tuple[str, str]] = field(default_factory=list)
    sha: str = ""


class History:
    """Branches of in-memory files; every method records one commit; :meth:`write` makes the repository."""

    def __init__(self, files: dict[str, str], subject: str = "[Misc] Initial import (#1)"):
        self.branches: dict[str, dict[str, str]] = {}
        self.heads: dict[str, int] = {}
        self.commits: list[Commit] = []
        self.tags: dict[str, int] = {}
        self._stream: list[bytes] = []
        self._parents: dict[int, Commit] = {}
        self._time = 1_780_000_000
        self.branches["main"] = {}
        self._record("main", subject, "", [(p, "", t) for p, t in sorted(files.items())], [], parent=None)

    # -- recording

    def _record(self, branch: str, subject: str, body: str, edits: list[Edit], renames: list[tuple[str, str]],
                parent: int | None) -> Commit:
        files = self.branches[branch]
        touched: dict[str, str | None] = {}
        for old, new in renames:
            files[new] = files.pop(old)
            touched[old] = None
            touched[new] = files[new]
        for path, old, new in edits:
            if old == "" and path not in files:
                files[path] = new
            elif new is None:
                files.pop(path)
            else:
                text = files[path]
                if text.count(old) != 1:
                    raise ValueError(f"{old!r} is not unique in {path} on {branch}")
                files[path] = text.replace(old, new)
            touched[path] = files.get(path)
        mark = len(self.commits) + 1
        c = Commit(mark, branch, subject, body, list(edits), list(renames))
        self.commits.append(c)
        self._time += 60
        msg = (subject + ("\n\n" + body if body else "") + "\n").encode()
        out = [f"commit refs/heads/{branch}\nmark :{mark}\n".encode(),
               f"author upstream <up@example.invalid> {self._time} +0000\n".encode(),
               f"committer upstream <up@example.invalid> {self._time} +0000\n".encode(),
               f"data {len(msg)}\n".encode(), msg]
        if parent is not None:
            out.append(f"from :{parent}\n".encode())
        for old, new in renames:
            out.append(f'R "{old}" "{new}"\n'.encode())
        for path, text in touched.items():
            if text is None:
                if not any(path == o for o, _ in renames):
                    out.append(f'D "{path}"\n'.encode())
                continue
            data = text.encode("utf-8", errors="surrogateescape")
            out.append(f'M 100644 inline "{path}"\ndata {len(data)}\n'.encode())
            out.append(data + b"\n")
        out.append(b"\n")
        self._stream.extend(out)
        self.heads[branch] = mark
        if parent is not None:
            self._parents[mark] = self.commits[parent - 1]
        return c

    def commit(self, branch: str, subject: str, edits: list[Edit], body: str = "",
               renames: list[tuple[str, str]] | None = None) -> Commit:
        return self._record(branch, subject, body, edits, renames or [], self.heads[branch])

    def branch(self, name: str, at: Commit | None = None, source: str = "main") -> None:
        """Start ``name`` at ``at`` (default: the head of ``source``)."""
        at = at or self.commits[self.heads[source] - 1]
        self.branches[name] = self._files_at(at)
        self.heads[name] = at.mark

    def _files_at(self, at: Commit) -> dict[str, str]:
        # replay the first-parent chain of ``at``; cheap enough for the sizes used here
        chain, cur = [], at
        while cur is not None:
            chain.append(cur)
            cur = self._parents.get(cur.mark)
        files: dict[str, str] = {}
        for c in reversed(chain):
            for old, new in c.renames:
                files[new] = files.pop(old)
            for path, old, new in c.edits:
                if old == "" and path not in files:
                    files[path] = new
                elif new is None:
                    files.pop(path, None)
                else:
                    files[path] = files[path].replace(old, new)
        return files

    def cherry_pick(self, branch: str, c: Commit, subject: str | None = None) -> Commit:
        return self.commit(branch, subject or c.subject, c.edits, body=f"(cherry picked from main: {c.subject})",
                           renames=c.renames)

    def revert(self, branch: str, c: Commit, pr: int, *, form: str = "subject") -> Commit:
        """Undo ``c``: ``form`` subject (``Revert "X" (#M)``), body (``Reverts vllm-project/vllm#N``) or silent."""
        inverse = [(p, new, old) for p, old, new in reversed(c.edits)]
        if form == "subject":
            return self.commit(branch, f'Revert "{c.subject}" (#{pr})', inverse)
        if form == "body":
            m = re.search(r"\(#(\d+)\)\s*$", c.subject)
            return self.commit(branch, f"[Misc] Back out a change (#{pr})", inverse,
                               body=f"Reverts vllm-project/vllm#{m.group(1)}" if m else "")
        return self.commit(branch, f"[Misc] Simplify (#{pr})", inverse)

    def tag(self, name: str, c: Commit) -> None:
        self.tags[name] = c.mark

    # -- writing

    def write(self, path: Path) -> dict[int, str]:
        """Create the repository at ``path`` (branch ``main`` checked out); returns mark -> sha."""
        path.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **GIT_ENV}
        subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
        stream = b"".join(self._stream)
        for name, mark in self.tags.items():
            stream += f"reset refs/tags/{name}\nfrom :{mark}\n\n".encode()
        marks = path / ".git" / "sndr-marks"
        subprocess.run(["git", "-C", str(path), "fast-import", "--quiet", f"--export-marks={marks}"],
                       input=stream, check=True, env=env)
        shas = {}
        for line in marks.read_text().splitlines():
            m, sha = line.split()
            shas[int(m[1:])] = sha
        marks.unlink()
        for c in self.commits:
            c.sha = shas[c.mark]
        subprocess.run(["git", "-C", str(path), "checkout", "-q", "-f", "main"], check=True, env=env)
        return shas


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


# ----------------------------------------------------------------------------- the pin-bump shape


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="surrogateescape")


@dataclass
class ReleaseHistory:
    history: History
    fix: Commit  # on main inside the range; cherry-picked onto releases/v0.32 before the tag
    fix_pick: Commit
    late: Commit  # on main after releases/v0.33 was cut; cherry-picked onto it
    late_pick: Commit
    probe: Commit  # a squash-merged change and its squash-form revert, both inside the range
    probe_revert: Commit
    updates: list[Commit]


def release_history(pin_root: Path, cand_root: Path, files: list[str]) -> ReleaseHistory:
    """Main goes from the real 0.32.0 files to the real 0.33.0 files, one squash commit per file.

    ``releases/v0.32`` is cut before a fix that is then cherry-picked onto it
    (tag ``v0.32.0`` = the real 0.32.0 files); ``releases/v0.33`` is cut before
    the last file update, which is cherry-picked onto it (tag ``v0.33.0`` = the
    real 0.33.0 files). Main goes on after both.
    """
    pin = {f: _read(pin_root, f) for f in files if (pin_root / f).is_file()}
    cand = {f: _read(cand_root, f) for f in files if (cand_root / f).is_file()}
    changed = [f for f in sorted(pin) if f in cand and pin[f] != cand[f]]
    # the fix: a line of 0.32.0 that main's base lacks
    fix_file = changed[0]
    lines = pin[fix_file].splitlines(keepends=True)
    k = next(i for i in range(len(lines) // 2, len(lines)) if lines[i].strip().startswith(("#", "return", "if ")))
    before = "".join(lines[max(0, k - 3):k])
    base_files = dict(pin)
    base_files[fix_file] = "".join(lines[:k] + lines[k + 1:])
    h = History(base_files, subject="[Misc] vLLM 0.32.0 base (#50000)")
    h.branch("releases/v0.32")
    fix = h.commit("main", "[Bugfix] Restore the line the base lost (#50010)",
                   [(fix_file, before + "".join(lines[k + 1:k + 3]), before + lines[k] + "".join(lines[k + 1:k + 3]))])
    fix_pick = h.cherry_pick("releases/v0.32", fix)
    h.tag("v0.32.0", fix_pick)
    probe_file = changed[1]
    anchor = h.branches["main"][probe_file]
    last_line = anchor.splitlines(keepends=True)[-1]
    tail = "".join(anchor.splitlines(keepends=True)[-3:])
    probe = h.commit("main", "[Misc] Add a temporary probe (#50020)",
                     [(probe_file, tail, tail + ("" if last_line.endswith("\n") else "\n")
                       + "\n\ndef _sndr_probe() -> int:\n    return 1\n")])
    probe_revert = h.revert("main", probe, 50021)
    updates = []
    for n, f in enumerate(changed[:-1]):
        cur = h.branches["main"][f]
        updates.append(h.commit("main", f"[Core] Update {Path(f).stem} (#{50100 + n})", [(f, cur, cand[f])]))
    h.branch("releases/v0.33")
    f = changed[-1]
    late = h.commit("main", f"[Core] Update {Path(f).stem} (#{50100 + len(changed)})",
                    [(f, h.branches["main"][f], cand[f])])
    late_pick = h.cherry_pick("releases/v0.33", late)
    h.tag("v0.33.0", late_pick)
    h.commit("main", "[Misc] Work after the release (#50900)", [("README.md", "", "vLLM\n")])
    return ReleaseHistory(h, fix, fix_pick, late, late_pick, probe, probe_revert, updates)


# ----------------------------------------------------------------------------- a large random history

_TAGS = ("[Bugfix]", "[Core]", "[Misc]", "[Kernel]", "[Perf]", "[V1]", "[Model]", "[Doc]", "[CI]")


@dataclass
class Generated:
    history: History
    surface: list[str]
    counts: dict[str, int]


def generate(pin_root: Path, surface: list[str], others: list[str], n_commits: int, seed: int = 17,
             cuts: tuple[float, float] = (0.30, 0.80)) -> Generated:
    """About ``n_commits`` commits of vLLM's shape on real files: see the module docstring.

    Main runs the whole way; ``releases/v0.32`` is cut at ``cuts[0]`` (30%) and
    gets cherry-picks of the main commits of the next 5%, tagged ``v0.32.0``;
    ``releases/v0.33`` is cut at ``cuts[1]`` (80%) and gets cherry-picks of the
    next 5%, tagged ``v0.33.0``. About 1 in 6 commits touches the surface; 1 in 60 is a revert
    (subject, body and silent forms, some of them chains), 1 in 40 adds a
    function, 1 in 80 renames an outside file.
    """
    rnd = random.Random(seed)
    files = {f: _read(pin_root, f) for f in surface + others if (pin_root / f).is_file()}
    surface = [f for f in surface if f in files]
    others = [f for f in others if f in files]
    h = History(files, subject="[Misc] vLLM base (#40000)")
    pr = [40001]
    counts = {"reverts": 0, "additions": 0, "renames": 0, "rewrites": 0, "picks": 0, "surface_edits": 0,
              "outside_edits": 0}
    recent: list[Commit] = []

    def next_pr() -> int:
        pr[0] += 1
        return pr[0]

    def edit_of(branch: str, path: str) -> Edit | None:
        text = h.branches[branch][path]
        lines = text.splitlines(keepends=True)
        for _ in range(20):
            k = rnd.randrange(5, max(6, len(lines) - 2))
            if k + 1 >= len(lines):
                continue
            old = lines[k] + lines[k + 1]
            if not lines[k].strip() or text.count(old) != 1 or not old.endswith("\n"):
                continue
            new = lines[k].rstrip("\n") + f"  # tweak {pr[0]}\n" + lines[k + 1]
            return (path, old, new)
        return None

    def addition_of(branch: str, path: str) -> Edit | None:
        text = h.branches[branch][path]
        m = list(re.finditer(r"^    def [a-z_]+\(self.*\n", text, re.M))
        if not m:
            return None
        hit = rnd.choice(m)
        old = hit.group(0)
        if text.count(old) != 1:
            return None
        name = f"sndr_helper_{pr[0]}"
        return (path, old, f"    def {name}(self) -> int:\n        return {pr[0]}\n\n" + old)

    cut32, cut33 = int(n_commits * cuts[0]), int(n_commits * cuts[1])
    end32, end33 = int(n_commits * (cuts[0] + 0.05)), int(n_commits * (cuts[1] + 0.05))
    picks32: list[Commit] = []
    picks33: list[Commit] = []
    i = 0
    done: set[str] = set()

    def once(name: str, cond: bool) -> bool:
        if cond and name not in done:
            done.add(name)
            return True
        return False

    while i < n_commits:
        i += 1
        if once("cut32", i >= cut32):
            h.branch("releases/v0.32")
        if once("cut33", i >= cut33):
            h.branch("releases/v0.33")
        roll = rnd.random()
        c = None
        tag = rnd.choice(_TAGS)
        if roll < 1 / 60 and recent:
            target = rnd.choice(recent[-30:])
            form = rnd.choice(("subject", "subject", "body", "silent"))
            try:
                c = h.revert("main", target, next_pr(), form=form)
                counts["reverts"] += 1
                recent.remove(target)
                if rnd.random() < 0.3:  # a revert of the revert: the original stands again
                    h.revert("main", c, next_pr(), form="subject")
                    counts["reverts"] += 1
                    i += 1
                c = None
            except (ValueError, KeyError):
                c = None
            continue
        if roll < 1 / 60 + 1 / 40:
            e = addition_of("main", rnd.choice(surface))
            if e:
                c = h.commit("main", f"{tag} Add helper {pr[0]} (#{next_pr()})", [e])
                counts["additions"] += 1
        elif roll < 1 / 60 + 1 / 40 + 1 / 80 and others:
            old = rnd.choice(others)
            new = old.replace(".py", f"_v{pr[0]}.py")
            c = h.commit("main", f"[Misc] Move {Path(old).stem} (#{next_pr()})", [], renames=[(old, new)])
            others[others.index(old)] = new
            counts["renames"] += 1
        elif roll < 1 / 6 + 0.05:
            path = rnd.choice(surface)
            text = h.branches["main"][path]
            tweaked = [m.group(0) for m in re.finditer(r"^.*  # tweak \d+\n", text, re.M)]
            if tweaked and rnd.random() < 0.25:
                old = rnd.choice(tweaked)
                if text.count(old) == 1:
                    c = h.commit("main", f"{tag} Rework {pr[0]} (#{next_pr()})",
                                 [(path, old, old.replace("# tweak", "# reworked"))])
                    counts["rewrites"] += 1
            if c is None:
                e = edit_of("main", path)
                if e:
                    c = h.commit("main", f"{tag} Fix {Path(path).stem} case {pr[0]} (#{next_pr()})", [e])
                    counts["surface_edits"] += 1
        else:
            path = rnd.choice(others)
            e = edit_of("main", path)
            if e:
                c = h.commit("main", f"{tag} Tidy {Path(path).stem} {pr[0]} (#{next_pr()})", [e])
                counts["outside_edits"] += 1
        if c is None:
            i -= 1  # nothing recorded: try again
            continue
        recent.append(c)
        if cut32 <= i < end32 and rnd.random() < 0.2:
            picks32.append(c)
        if cut33 <= i < end33 and rnd.random() < 0.2:
            picks33.append(c)
        if once("tag32", i >= end32):
            for p in picks32:
                try:
                    h.cherry_pick("releases/v0.32", p)
                    counts["picks"] += 1
                except (ValueError, KeyError):
                    pass
            h.tag("v0.32.0", h.commits[h.heads["releases/v0.32"] - 1])
        if once("tag33", i >= end33):
            for p in picks33:
                try:
                    h.cherry_pick("releases/v0.33", p)
                    counts["picks"] += 1
                except (ValueError, KeyError):
                    pass
            h.tag("v0.33.0", h.commits[h.heads["releases/v0.33"] - 1])
    counts["commits"] = len(h.commits)
    return Generated(h, surface, counts)
