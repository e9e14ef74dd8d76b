"""``anchors/vllm-<version>.json``: where every edit's anchor sits on a pin.

The manifest is a committed, reviewable record produced by the same planner
that apply uses, run on the pristine tree with the default configuration. A
pin bump or a patch edit shows up as a diff of this file in review, and
``python -m sndr manifest check`` turns a stale manifest into a CI failure
rather than a silent fallback.

It is deterministic: sorted keys, no timestamps, no tree paths; only content
(tree digest, version, patch digests, verdicts and positions). The same tree
read as a directory, a wheel or a git revision gives byte-identical output.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import EXIT_FINDINGS, EXIT_OK, bad_input
from .load import PatchSet, load_patch_set, loc_str, shipped_anchors_dir
from .model import Patch, Verdict
from .tree import DirTree, Tree, open_tree

FORMAT: Literal[1] = 1


# ----------------------------------------------------------------------------- model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestLocation(_Strict):
    offset: int = Field(description="byte offset in the pristine file")
    line: int
    qualname: str = ""


class ManifestEdit(_Strict):
    """One edit (text, create or runtime) as the planner saw it on the pristine pin."""

    name: str
    file: str
    kind: Literal["text", "create", "runtime"] = "text"
    required: bool = True
    group: str | None = None
    verdict: Verdict
    offset: int | None = Field(default=None, description="byte offset of the anchor in the pristine file (UTF-8)")
    char_offset: int | None = Field(default=None, description="the same position as an index into the decoded text (what str.find returns)")
    line: int | None = None
    qualname: str | None = Field(default=None, description="enclosing Class.method of the anchor, e.g. KVCacheCoordinator.find_longest_cache_hit")
    anchor_sha256: str | None = Field(default=None, description="sha256 of the anchor text (UTF-8); None for create and runtime edits")
    replacement_sha256: str | None = Field(default=None, description="sha256 of the replacement (or created file) text")
    target: str | None = Field(default=None, description="runtime edits: module:Qual.name replaced at import time")
    chained_from: list[str] = Field(default_factory=list, description="patches whose replacement this anchor lies in")
    locations: list[ManifestLocation] = Field(default_factory=list, description="every occurrence, for ambiguous anchors")


class ManifestPatch(_Strict):
    id: str
    kind: str
    digest: str = Field(description="sha256 of the patch's canonical JSON (Patch.digest())")
    status: str
    reason_code: str = ""
    edits: list[ManifestEdit] = Field(default_factory=list)


class ManifestFile(_Strict):
    pristine_sha256: str | None = Field(description="sha256 of the file's bytes on the pristine pin; None when absent")


class Manifest(_Strict):
    """The anchors of one patch set on one pinned vLLM tree."""

    format: Literal[1] = FORMAT
    tool: Literal["sndr"] = "sndr"
    vllm_version: str
    tree_digest: str = Field(description="sndr.tree digest: sha256 over sorted (path, sha256(content)) of vllm/**/*.py")
    patch_set_digest: str = Field(description="digest of every patch in the set, enabled or not")
    patches: list[ManifestPatch]
    files: dict[str, ManifestFile]

    def to_json(self) -> str:
        """The committed bytes: two-space indent, sorted keys, trailing newline."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def edit(self, patch_id: str, name: str) -> ManifestEdit | None:
        for p in self.patches:
            if p.id == patch_id:
                return next((e for e in p.edits if e.name == name), None)
        return None


def manifest_schema() -> dict:
    return Manifest.model_json_schema()


def manifest_name(version: str) -> str:
    return f"vllm-{version}.json"


# ----------------------------------------------------------------------------- build (pure given a tree)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def pristine_source(tree: Tree) -> tuple[Tree, str | None]:
    """The tree a manifest is built from, and a line saying so when it is not ``tree`` as it is.

    Positions must describe the pristine pin. A directory sndr patched is read as upstream shipped it
    (:meth:`sndr.commit.TreeRoot.pristine`): every file its ledger records from its pristine copy in
    ``.sndr/objects``, whatever it holds now, the rest as it is. Refused (``tree_patched``, naming the
    file) only where no pristine view exists: an interrupted commit is pending (the journal), a stored
    copy cannot be read, or, under a ledger of another vLLM version (an upgrade in place), a file still
    holds sndr's patched bytes, whose only pristine copy is of that other version.
    """
    from .state import STATE_DIR

    if not isinstance(tree, DirTree) or tree.root is None or not (tree.root / STATE_DIR).is_dir():
        return tree, None
    from .commit import TreeRoot, sha256_bytes
    from .errors import SndrError

    troot = TreeRoot(tree.root)
    hint = f"build from the release instead: --tree vllm=={tree.version}"
    ledger = troot.read_ledger()  # a corrupt ledger is its own error (ledger_corrupt, with its recovery path)
    if troot.journal_path.exists():
        raise bad_input("tree_patched", "an interrupted sndr commit is pending on this tree, so its files may be "
                        "half patched: no pristine view to build a manifest from", file=str(troot.journal_path),
                        hint=f"python -m sndr.apply --verify --tree {tree.root} rolls it back; or {hint}")
    if ledger is None or not ledger.files:
        return tree, None
    if ledger.vllm_version and ledger.vllm_version != tree.version:
        held = [rel for rel, e in sorted(ledger.files.items()) if not e.read_only
                and (now := troot.read_bytes(rel)) is not None and sha256_bytes(now) == e.patched_sha256]
        held = [rel for rel in held if rel not in set(troot.reinstalled(held))]
        if held:
            raise bad_input("tree_patched", f"{held[0]} still holds the bytes sndr patched into vLLM "
                            f"{ledger.vllm_version}, and the tree now holds vLLM {tree.version}: no pristine copy "
                            f"of it for this version", file=held[0], hint=hint)
        return tree, (f"the ledger in {troot.state} was written for vLLM {ledger.vllm_version}; no file holds its "
                      f"patched bytes now: built from the tree as vLLM {tree.version}'s installer left it")
    view = troot.pristine(ledger, base=tree)
    for rel in sorted(ledger.files):
        try:
            view.read_bytes(rel)
        except SndrError as exc:
            why = exc.problems[0]
            raise bad_input("tree_patched", f"{rel} is patched by sndr and its pristine copy cannot be read "
                            f"({why.code}: {why.message}): no pristine view to build a manifest from",
                            file=rel, hint=hint) from None
    return view, (f"{tree.root} is patched by sndr: built from the pristine copies of its {len(ledger.files)} "
                  f"patched file(s) in {troot.objects} (the tree as upstream shipped it)")


def _edit_sources(patch: Patch) -> dict[str, dict]:
    """name -> the static fields of each declared edit (hashes, kind, target)."""
    out: dict[str, dict] = {}
    for f in patch.files:
        if f.create is not None:
            out["create"] = {"kind": "create", "replacement_sha256": _sha(f.create)}
        for e in f.edits:
            out[e.name] = {"kind": "text", "anchor_sha256": _sha(e.anchor), "replacement_sha256": _sha(e.replacement)}
    for r in patch.runtime:
        out[r.name] = {"kind": "runtime", "target": r.target}
    return out


def _byte_offset(text: str | None, char_offset: int | None) -> int | None:
    """The planner works on decoded text; the manifest also records bytes, which tools outside Python use."""
    if text is None or char_offset is None:
        return None
    return len(text[:char_offset].encode("utf-8", "surrogateescape"))


def _manifest_edit(result, static: dict, text: str | None) -> ManifestEdit:
    return ManifestEdit(
        name=result.name, file=result.file, required=result.required, group=result.group, verdict=result.verdict,
        offset=_byte_offset(text, result.offset), char_offset=result.offset, line=result.line,
        qualname=result.qualname, chained_from=list(result.chained_from),
        # a location is a match in the text, so the text was read
        locations=[ManifestLocation(offset=len((text or "")[:loc.offset].encode("utf-8", "surrogateescape")),
                                    line=loc.line, qualname=loc.qualname)
                   for loc in result.locations],
        **static,
    )


def _referenced_files(patch_set: PatchSet, plan) -> list[str]:
    paths = {f.path for p in patch_set.patches for f in p.files}
    paths |= {e.file for r in plan.patches for e in r.edits if e.file.endswith(".py")}
    return sorted(paths)


def build_manifest(tree: Tree, patch_set: PatchSet, notes: list[str] | None = None) -> Manifest:
    """Plan the patch set on the pristine tree with default enablement and record the result.

    The environment is deliberately empty: ``SNDR_ENABLE_*`` in the caller's
    shell must not change a committed file. A tree sndr patched is read through
    :func:`pristine_source` (its line goes into ``notes``).
    """
    from .plan import build_plan

    tree, note = pristine_source(tree)
    if note is not None and notes is not None:
        notes.append(note)
    version = tree.version
    texts: dict[str, str | None] = {}

    def read(rel: str) -> str | None:
        if rel not in texts:
            texts[rel] = tree.read_text(rel)
        return texts[rel]

    plan = build_plan(patch_set, read, version, environ={}, check_compile=False)
    by_id = patch_set.by_id
    patches = []
    for result in plan.patches:
        patch = by_id[result.id]
        static = _edit_sources(patch)
        patches.append(ManifestPatch(
            id=result.id, kind=patch.kind, digest=patch.digest(), status=result.status, reason_code=result.reason_code,
            edits=[_manifest_edit(e, static.get(e.name, {}), texts.get(e.file)) for e in result.edits],
        ))
    files = {}
    for rel in _referenced_files(patch_set, plan):
        data = tree.read_bytes(rel)
        files[rel] = ManifestFile(pristine_sha256=hashlib.sha256(data).hexdigest() if data is not None else None)
    return Manifest(vllm_version=version, tree_digest=tree.digest, patch_set_digest=patch_set.digest(),
                    patches=patches, files=files)


def trusted_offsets(manifest: Manifest, patch_set: PatchSet, file_sha256: dict[str, str | None]) -> dict[tuple[str, str], int]:
    """Pristine offsets (into the decoded text) of ``applies`` edits the manifest still vouches for.

    An offset is trusted only when the target file's pristine sha256 equals the
    recorded one and the patch's digest is unchanged: the planner is a pure
    function of those, so it would find the same offset. Anything else falls
    back to the slow path (searching the text).
    """
    current = {p.id: p.digest() for p in patch_set.patches}
    out: dict[tuple[str, str], int] = {}
    for p in manifest.patches:
        if current.get(p.id) != p.digest:
            continue
        for e in p.edits:
            recorded = manifest.files.get(e.file)
            if (e.verdict == Verdict.APPLIES and e.char_offset is not None and recorded is not None
                    and recorded.pristine_sha256 is not None and file_sha256.get(e.file) == recorded.pristine_sha256):
                out[(p.id, e.name)] = e.char_offset
    return out


# ----------------------------------------------------------------------------- compare


#: A manifest sndr writes is ~60 KB for the shipped set; one over this is not one of them.
MAX_MANIFEST_BYTES = 64 * 2**20


def load_manifest(path: Path) -> Manifest:
    return _read_manifest(path)[1]


def _read_manifest(path: Path) -> tuple[bytes, Manifest]:
    """The bytes of the manifest ``path`` and the manifest they hold. Read as every input file is (a FIFO, a
    device or a directory refused without blocking, a size bound, strict UTF-8); a bad one names the file and
    the line (malformed JSON) or the field (a manifest that does not match the schema)."""
    from pydantic import ValidationError

    from .fsio import FileProblem, decode_strict, read_regular

    hint = "regenerate it with python -m sndr manifest build"
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES, "the manifest")
        text = decode_strict(raw, path, "the manifest")
    except FileProblem as exc:
        if exc.code == "not_found" and path.is_symlink():  # dangling: say where it points
            raise bad_input("manifest_missing", f"the manifest is a symlink to {os.readlink(path)}, which does not "
                            "exist", file=str(path)) from None
        code = "manifest_missing" if exc.code == "not_found" else exc.code
        raise bad_input(code, exc.message, file=exc.path, line=exc.line) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input("manifest_corrupt", f"not a valid manifest: malformed JSON ({exc.msg}, column {exc.colno})",
                        file=str(path), line=exc.lineno, hint=hint) from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit integer, nesting too deep
        raise bad_input("manifest_corrupt", f"not a valid manifest: unusable JSON ({str(exc).split(';')[0]})",
                        file=str(path), hint=hint) from None
    try:
        return raw, Manifest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()  # every one named, with its place (patches[3].edits[0].verdict), never "(+N more)"
        where = "; ".join(f"{loc_str(e['loc']) or '(top level)'}: {e['msg']}" for e in errors)
        raise bad_input("manifest_corrupt", f"not a valid manifest ({len(errors)} error(s)): {where}",
                        file=str(path), hint=hint) from None


def _edit_key(e: ManifestEdit) -> dict:
    return e.model_dump(mode="json")


def diff_manifests(old: Manifest, new: Manifest) -> list[str]:
    """Human lines naming what changed, most specific first: a reviewer should not diff JSON by eye."""
    out: list[str] = []
    if old.vllm_version != new.vllm_version:
        out.append(f"vllm version {old.vllm_version} -> {new.vllm_version}")
    if old.tree_digest != new.tree_digest:
        out.append(f"tree digest {old.tree_digest[:12]} -> {new.tree_digest[:12]} (the pin's sources differ)")
    before = {p.id: p for p in old.patches}
    after = {p.id: p for p in new.patches}
    for pid in sorted(set(before) - set(after)):
        out.append(f"{pid}: in the manifest but no longer in the patch set")
    for pid in sorted(set(after) - set(before)):
        out.append(f"{pid}: new patch, not in the manifest")
    for pid in sorted(set(before) & set(after)):
        out.extend(_diff_patch(before[pid], after[pid]))
    for rel in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(rel), new.files.get(rel)
        if a != b:
            out.append(f"{rel}: pristine sha256 {_short(a)} -> {_short(b)}")
    if not out and old.to_json() != new.to_json():
        out.append("manifest differs (order or format); rebuild it")
    return out


def _short(f: ManifestFile | None) -> str:
    if f is None:
        return "(not recorded)"
    return (f.pristine_sha256 or "(absent)")[:12]


def _diff_patch(a: ManifestPatch, b: ManifestPatch) -> list[str]:
    out = []
    if a.digest != b.digest:
        out.append(f"{a.id}: patch definition changed")
    if a.status != b.status:
        out.append(f"{a.id}: status {a.status} -> {b.status}")
    ea, eb = {e.name: e for e in a.edits}, {e.name: e for e in b.edits}
    for name in sorted(set(ea) | set(eb)):
        x, y = ea.get(name), eb.get(name)
        if x is None or y is None:
            out.append(f"{a.id}.{name}: edit {'added' if x is None else 'removed'}")
        elif x != y:
            fields = [k for k in _edit_key(x) if _edit_key(x)[k] != _edit_key(y)[k]]
            detail = ", ".join(f"{k} {getattr(x, k)!s:.40} -> {getattr(y, k)!s:.40}" if k in ("verdict", "line", "qualname", "file")
                               else k for k in fields)
            out.append(f"{a.id}.{name}: {detail}")
    return out


# ----------------------------------------------------------------------------- I/O


def write_manifest(manifest: Manifest, out: Path) -> Path:
    """Atomic write: a reader (or a CI check racing a rebuild) never sees half a file.

    ``out`` is a directory (``vllm-<version>.json`` is written into it) or, when
    it names a ``.json`` file, that file; ``-`` is stdout.
    """
    from .cli import write_output

    if str(out) == "-" or out_is_file(out):  # '-': stdout
        write_output(out, manifest.to_json(), "--out")  # the one output writer: no symlink, FIFO or device
        return out
    target = out / manifest_name(manifest.vllm_version)
    # --out DIR is the path the user named: never a symlink (to a directory elsewhere) either; made if missing
    write_output(target, manifest.to_json(), "--out", named_dir=True)
    return target


def out_is_file(out: Path) -> bool:
    """``--out``: True for a ``.json`` file name, False for a directory; anything else is refused.

    A directory is an existing directory or a name without a suffix; a file is a
    name ending in ``.json`` (that is not an existing directory). An existing
    file, or a name with another suffix, is neither, and says so instead of
    silently becoming a directory of that name. A symlink, FIFO or device is
    taken by its name alone: :func:`sndr.cli.check_output` refuses it, saying
    what it is (a symlink to a directory is never written through).
    """
    if out.is_symlink() or (out.exists() and not out.is_dir() and not out.is_file()):
        return out.suffix == ".json"
    if out.is_dir():
        return False
    if out.suffix == ".json":
        return True
    if out.exists():
        raise bad_input("usage", f"--out {out} is an existing file that is not .json; --out wants a directory "
                        "or a FILE.json", file=str(out), key="--out",
                        hint=f"e.g. --out {out.parent / 'anchors'} or --out {out.with_suffix('.json')}")
    if out.suffix:
        raise bad_input("usage", f"--out {out} looks like a file name but not a .json one; --out wants a directory "
                        "(vllm-<version>.json is written into it) or a FILE.json", key="--out",
                        hint=f"e.g. --out {out.with_suffix('.json')} or --out {out.with_suffix('')}")
    return False


def committed_manifests(anchors: Path) -> list[Path]:
    return sorted(anchors.glob("vllm-*.json")) if anchors.is_dir() else []


def _check_anchors_dir(anchors: Path) -> None:
    """``--anchors`` names the directory of the manifests (``vllm-<version>.json``): a missing one holds none
    (``check`` says which are missing); anything else that is not a directory is refused, naming it."""
    import stat

    from .fsio import kind_of

    try:
        mode = anchors.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise bad_input("anchors_not_a_dir", f"--anchors cannot be examined ({exc.strerror})", file=str(anchors),
                        key="--anchors") from None
    if stat.S_ISDIR(mode):
        return
    kind = kind_of(mode)
    if stat.S_ISREG(mode) and _manifest_version(anchors) is not None:
        hint = f"--anchors {anchors.parent or '.'} (the directory that holds it)"
    else:
        hint = ("pass the directory that holds the manifests; a manifest is found there by its name, "
                "vllm-<version>.json (python -m sndr manifest build --out DIR writes it so)")
    raise bad_input("anchors_not_a_dir", f"--anchors is {kind}, not a directory: it names the directory that "
                    "holds the manifests (vllm-<version>.json), not a manifest", file=str(anchors), key="--anchors",
                    hint=hint)


def _manifest_version(path: Path) -> str | None:
    """The version a manifest's name ``vllm-<version>.json`` records, None for another name."""
    name = path.name
    if not (name.startswith("vllm-") and name.endswith(".json")) or len(name) <= len("vllm-.json"):
        return None
    return name[len("vllm-"):-len(".json")]


def pin_trees(anchors: Path, tree_spec: str | None, flag: str = "--anchors") -> list[str]:
    """The trees to check: the one given, else the pin of every committed manifest (named by its file name,
    which must hold a PEP 440 version: the file is named when it does not)."""
    if tree_spec is not None:  # '' too: open_tree refuses it (bad_tree_spec), never the default pin instead
        return [tree_spec]
    from packaging.version import InvalidVersion, Version

    specs = []
    for path in committed_manifests(anchors):
        version = _manifest_version(path) or ""
        try:
            Version(version)
        except InvalidVersion:
            raise bad_input("bad_version", f"{version!r} in this manifest's name is not a PEP 440 version: a "
                            "manifest is named vllm-<version>.json, and its version is the pin checked",
                            file=str(path), key=flag,
                            hint="rename or remove it, or pass --tree to name the tree") from None
        specs.append(f"vllm=={version}")
    return specs


def build_command(tree_spec: str, patches_dir: Path | str | None = None, out: Path | str | None = None) -> str:
    """The ``python -m sndr manifest build`` command line that (re)builds a manifest: the one spelling of it
    for every hint (``manifest check``, ``pin advance``), with ``--patches`` and ``--out`` when they are not
    the defaults, so that running it as printed builds the manifest that was checked."""
    import shlex

    cmd = f"python -m sndr manifest build --tree {shlex.quote(str(tree_spec))}"
    if patches_dir is not None:
        cmd += f" --patches {shlex.quote(str(patches_dir))}"
    if out is not None:
        cmd += f" --out {shlex.quote(str(out))}"
    return cmd


def failing_edits(manifest: Manifest) -> list[tuple[str, str, str]]:
    """(patch, edit, verdict) of every required (or group) edit the manifest records as not applying: the one
    rule ``manifest build`` and ``manifest check`` exit 1 on."""
    return [(p.id, e.name, e.verdict.value) for p in manifest.patches for e in p.edits
            if e.verdict in (Verdict.DRIFTED, Verdict.AMBIGUOUS, Verdict.FILE_MISSING) and (e.required or e.group)]


def check(tree_spec: str | None, patches_dir: Path | None, anchors: Path) -> tuple[int, list[str]]:
    """(exit code, lines). 1 when a committed manifest is stale or missing for a non-empty set."""
    _check_anchors_dir(anchors)
    patch_set = load_patch_set(patches_dir)
    specs = pin_trees(anchors, tree_spec)
    custom = anchors.resolve() != shipped_anchors_dir().resolve()
    if not specs:
        if not patch_set.patches:
            return EXIT_OK, ["no patches and no manifest: nothing to check"]
        return EXIT_FINDINGS, [f"no manifest in {anchors} for a set of {len(patch_set.patches)} patch(es); "
                               f"run: {build_command('vllm==<pin>', patches_dir, anchors if custom else None)}"]
    code, lines = EXIT_OK, []
    for spec in specs:
        with _open_pin(spec, anchors, tree_spec is None) as tree:
            path = anchors / manifest_name(tree.version)
            if not path.exists() and not path.is_symlink():
                code = EXIT_FINDINGS
                lines.append(f"{path}: missing; run: {build_command(spec, patches_dir, path if custom else None)}")
                continue
            raw, committed = _read_manifest(path)
            notes: list[str] = []
            fresh = build_manifest(tree, patch_set, notes)
            lines.extend(f"note: {n}" for n in notes)
        failing = failing_edits(fresh)
        if failing:  # up to date or not, a manifest that records a broken required edit is a finding (as build)
            code = EXIT_FINDINGS
            lines.extend(f"  {pid}.{name}: {verdict} on vllm {fresh.vllm_version}" for pid, name, verdict in failing)
        if raw == fresh.to_json().encode("utf-8"):
            lines.append(f"{path}: up to date ({counts(fresh)}; vllm {fresh.vllm_version})"
                         + (f"; {len(failing)} required edit(s) do not apply, listed above" if failing else ""))
            continue
        code = EXIT_FINDINGS
        lines.append(f"{path}: stale; rebuild with: {build_command(spec, patches_dir, path if custom else None)}")
        lines.extend(f"  {d}" for d in diff_manifests(committed, fresh))
    return code, lines


def _open_pin(spec: str, anchors: Path, from_name: bool) -> Tree:
    """``open_tree(spec)``; a pin read from a manifest's name says so when it cannot be opened."""
    from dataclasses import replace

    from .errors import SndrError

    try:
        return open_tree(spec)
    except SndrError as exc:
        if not from_name:
            raise
        path = anchors / manifest_name(spec[len("vllm=="):])
        why = f"{spec} is the pin named by {path}; pass --tree to check another tree"
        raise SndrError([replace(exc.problems[0], hint=f"{exc.problems[0].hint}; {why}" if exc.problems[0].hint
                                 else why), *exc.problems[1:]], exc.exit_code) from None


def counts(manifest: Manifest) -> str:
    """``36 patches: 10 applies, 23 merged, 2 gated, 1 failed``: what the set does on the tree, not its size only
    (a tree outside every patch's version range reads ``36 gated``, not as if 36 patches applied)."""
    from collections import Counter

    by = Counter(p.status for p in manifest.patches)
    return f"{len(manifest.patches)} patches" + (": " + ", ".join(f"{n} {s}" for s, n in sorted(by.items()))
                                                 if by else "")


__all__ = [
    "Manifest", "ManifestEdit", "ManifestPatch", "ManifestFile", "ManifestLocation",
    "build_manifest", "check", "counts", "diff_manifests", "failing_edits", "load_manifest", "manifest_schema",
    "out_is_file", "pin_trees", "trusted_offsets", "write_manifest",
]
