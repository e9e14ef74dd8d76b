"""Errors are values: a reason code, a message and a location.

Every problem sndr can report is a :class:`Problem`. Code that must stop raises
:class:`SndrError`, which carries one or more problems; the CLI maps the
``exit_code`` of the error to the process exit status (0 ok, 1 findings,
2 bad input, 3 internal).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    file: str | None = None
    line: int | None = None
    key: str | None = None
    patch: str | None = None
    hint: str | None = None

    def render(self) -> str:
        where = self.file or ""
        if where and self.line is not None:
            where += f":{self.line}"
        if self.key:
            where += f" [{self.key}]" if where else f"[{self.key}]"
        head = f"{where}: " if where else ""
        pid = f"{self.patch}: " if self.patch and self.patch not in head else ""
        text = f"{head}{pid}{self.message} ({self.code})"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class SndrError(Exception):
    problems: list[Problem] = field(default_factory=list)
    exit_code: int = EXIT_BAD_INPUT

    def __init__(self, problems: Problem | Iterable[Problem], exit_code: int = EXIT_BAD_INPUT):
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        self.exit_code = exit_code
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(p.render() for p in self.problems)


def bad_input(code: str, message: str, **where: Any) -> SndrError:
    return SndrError(Problem(code, message, **where), EXIT_BAD_INPUT)


# ----------------------------------------------------------------------------- the code registry


@dataclass(frozen=True)
class Code:
    """A registered reason code: the exit status it stops a command with, and what it means."""

    exit: int
    meaning: str


_B, _F, _I = EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL

#: Every reason code sndr reports, with its exit status and a one-line meaning.
#: ``python -m sndr schema codes`` prints it; ``tests/test_codes.py`` checks that
#: every code raised anywhere in ``sndr/`` is here. Verdict codes (what one edit
#: reads on a tree) are findings (exit 1) when they stop a command.
CODES: dict[str, Code] = {
    # -- patch files and patch sets (bad input) ----------------------------------------
    "toml_syntax": Code(_B, "a patch file is not valid TOML"),
    "bad_patch": Code(_B, "a patch file does not match the patch schema (docs/format.md)"),
    "too_large": Code(_B, "an input file is larger, or nested deeper, than sndr accepts"),
    "too_deep": Code(_B, "input nested too deeply to process"),
    "duplicate_id": Code(_B, "two patch files define the same patch id"),
    "requires_cycle": Code(_B, "patches require (or are ordered after) each other in a cycle"),
    "unknown_id": Code(_B, "a patch id named on the command line or in requires/after/conflicts does not exist"),
    "patches_dir_missing": Code(_B, "the patch directory does not exist"),
    "path_unknown": Code(_B, "a patch's target path is not a file of the pinned vLLM: a typo (the nearest path is named)"),
    "name_mismatch": Code(_B, "a patch file's name does not start with its id (reported as a note: the set still loads)"),
    "patch_subdir": Code(_B, "a subdirectory of the patch directory holds patch files, which are not read (reported as a note)"),
    "patches_not_a_dir": Code(_B, "the patch directory (--patches, $SNDR_PATCHES) is a file, not a directory"),
    "empty_patch_set": Code(_B, "the patch set is empty (pass --allow-empty to revert everything on purpose)"),
    "path_outside_package": Code(_B, "a patch targets a path outside the vllm/ package and the allowed roots"),
    "bad_env": Code(_B, "an environment variable has a value sndr does not accept"),
    "bad_profile": Code(_B, "a deployment profile is malformed"),
    "usage": Code(_B, "the command line asks for something that cannot be done"),
    # -- plugin packs ---------------------------------------------------------------------
    "pack_import": Code(_B, "an installed plugin pack failed to import"),
    "pack_hook_failed": Code(_B, "a plugin pack's sndr_patch_dirs() raised"),
    "pack_dir_missing": Code(_B, "a plugin pack names a patch directory that does not exist"),
    "pack_id_namespace": Code(_B, "a plugin pack's patch id is not in the pack's namespace"),
    "pack_module_outside": Code(_B, "a plugin pack's runtime module lies outside the pack"),
    "module_outside": Code(_B, "a patch's runtime module lies outside sndr (and its plugin pack)"),
    # -- trees and files --------------------------------------------------------------------
    "not_a_tree": Code(_B, "the directory does not contain a vllm/ package"),
    "no_vllm": Code(_B, "the path does not contain a vllm/ package"),
    "vllm_not_found": Code(_B, "no installed vLLM was found for this command"),
    "site_not_a_dir": Code(_B, "hook install|uninstall: --site is not a directory"),
    "sndr_not_importable": Code(_B, "hook install: the --python interpreter cannot import sndr, so its .pth would "
                                    "import nothing"),
    "tree_not_found": Code(_B, "the tree path does not exist"),
    "bad_tree_spec": Code(_B, "a tree spec (DIR, vllm==X, wheel, git:REV, installed[:PY]) is malformed, or names "
                              "a path that is none of them (a regular file, FIFO, device or socket: said which)"),
    "bad_path": Code(_B, "a path is not a relative POSIX path inside the tree"),
    "path_escape": Code(_B, "a path resolves outside the tree (symlink or '..')"),
    "symlink_refused": Code(_B, "a target or sndr's state directory is a symlink, which sndr refuses to follow"),
    "not_a_file": Code(_B, "a target is a directory, not a file"),
    "not_regular": Code(_B, "a file is a FIFO, socket, device or directory, not a regular file"),
    "not_found": Code(_B, "a file does not exist"),
    "file_too_large": Code(_B, "a target or input file is over sndr's size limit"),
    "unreadable": Code(_B, "a file cannot be read (permissions or I/O error)"),
    "read_only": Code(_B, "a file cannot be written (read-only filesystem or permissions)"),
    "os_error": Code(_B, "the operating system refused an operation (disk full, I/O error, ...)"),
    "not_utf8": Code(_B, "a file is not valid UTF-8"),
    "bad_version": Code(_B, "a version is not a PEP 440 version"),
    "version_unknown": Code(_B, "the vLLM version of a tree cannot be determined"),
    "version_not_found": Code(_B, "a vLLM version is not published on the package index"),
    "fetch_failed": Code(_B, "pip could not download a vLLM wheel"),
    "offline": Code(_B, "a tree is not cached and SNDR_OFFLINE=1 forbids fetching it"),
    "cache_unsafe": Code(_B, "sndr's cache root (or a directory on its path) could be changed by another user: refused"),
    "bad_wheel": Code(_B, "a wheel file cannot be read"),
    "python_not_found": Code(_B, "the interpreter named by installed:PYTHON does not exist"),
    "python_failed": Code(_B, "the interpreter named by installed:PYTHON could not locate vLLM"),
    "git_not_found": Code(_B, "git is not installed"),
    "git_failed": Code(_B, "a git command failed"),
    "git_rev_not_found": Code(_B, "a git revision does not exist"),
    "not_git": Code(_B, "the directory is not a git checkout"),
    # -- state of a tree (.sndr/) ---------------------------------------------------------------
    "ledger_corrupt": Code(_B, "the ledger's checksum does not match (edited by hand or damaged)"),
    "journal_corrupt": Code(_B, "the journal of an interrupted commit is unreadable"),
    "nothing_to_salvage": Code(_F, "salvage-ledger on a tree without a ledger to repair: no .sndr/ (sndr never "
                                   "wrote there), no ledger and none kept matches the files (a reverted tree), or a "
                                   "ledger that reads while none kept matches the files (a file changed since apply: "
                                   "apply --verify names it); the tree is left untouched"),
    "no_ledger_matches": Code(_F, "salvage-ledger: the tree's ledger does not read and no ledger sndr kept in "
                                  ".sndr/objects matches its files (each names a file that differs), so none was put "
                                  "back; reinstall vLLM and delete .sndr/"),
    "journal_too_large": Code(_B, "the journal of an interrupted commit is larger than any sndr writes"),
    "journal_pending": Code(_F, "gc --dry-run on a tree with an interrupted commit: what it keeps depends on how the "
                                "commit resolves (gc without --dry-run rolls it back first)"),
    "journal_mismatch": Code(_B, "a file holds neither the before- nor the after-bytes of the interrupted commit"),
    "object_missing": Code(_B, "a copy sndr stored in .sndr/objects is missing"),
    "object_corrupt": Code(_B, "a copy sndr stored in .sndr/objects does not match its hash"),
    "state_unsafe": Code(_B, "sndr's state directory (.sndr) is not a plain directory sndr can trust"),
    "extra_missing": Code(_B, "an option needs an optional dependency that is not installed (the hint names it)"),
    "ledger_stale": Code(_F, "the ledger records another vLLM version or tree than the one installed now"),
    # -- applying, verifying, reverting (findings) ---------------------------------------------
    "hash_mismatch": Code(_F, "a file does not hold the patched bytes the ledger records"),
    "modified_since_apply": Code(_F, "a file was changed by someone else since sndr patched it"),
    "read_changed": Code(_F, "a file the set read and wrote nothing to (a merged marker, an absent optional anchor, "
                             "a runtime target) changed since apply: the verdicts there may no longer hold"),
    "force_merge_conflict": Code(_F, "apply --force cannot merge a change made since apply: it overlaps or is next "
                                     "to lines sndr's edits changed (3-way merge; the file, the line changed since "
                                     "apply and the patches whose lines it touches named, nothing written)"),
    "changed_during_apply": Code(_F, "a file changed between plan and commit"),
    "foreign_write_lost": Code(_F, "a concurrent foreign write landed during the commit; the set was rolled back"),
    "not_applied": Code(_F, "a patch that should be active is not applied"),
    "vllm_plugins_excludes_sndr": Code(_F, "VLLM_PLUGINS is set and does not name sndr (vLLM compares each comma-"
                                           "separated name exactly): vLLM never calls sndr's register(), so its "
                                           "runtime and plugin patches are not active and the process does not attest "
                                           "by itself (sndr status, apply and the in-memory hook say so)"),
    "plugin_not_called": Code(_F, "vLLM loaded its general plugins in a process and sndr's register() was not among "
                                  "them although VLLM_PLUGINS allows it (sndr's vllm.general_plugins entry point is "
                                  "not installed for that interpreter): its runtime and plugin patches are not active"),
    "patch_set_mismatch": Code(_F, "the tree was patched with another patch set"),
    "compile_error": Code(_F, "a patched file does not compile"),
    "conflicts_enabled": Code(_F, "two patches declared as conflicting are both enabled"),
    "overlap_conflict": Code(_F, "two unordered patches change the same bytes"),
    "left_out": Code(_F, "a patch whose on_failure is fail was left out whole by --keep-going"),
    "requires_left_out": Code(_F, "a patch requires a patch that was left out, and its own on_failure is fail"),
    "nothing_to_do": Code(_F, "every edit of a patch is optional and absent (or its file is missing): it changes nothing"),
    "when_mismatch": Code(_F, "a patch's when table does not match the deployment profile (the patch is gated)"),
    "when_unknown": Code(_F, "a patch's when table needs a key the deployment profile does not know (gated)"),
    "when_forced": Code(_F, "a patch's when table needs a key the profile does not know, and the profile's force "
                            "list enables it anyway (a note: the patch applies)"),
    # -- verdicts of one edit (findings when they stop a command) -----------------------------
    "applies": Code(_F, "the edit's anchor is found exactly once: it applies"),
    "applied": Code(_F, "the edit's replacement is already in place"),
    "deletion_unverifiable": Code(_F, "the anchor of a pure deletion is gone: whether it was applied cannot be told from the text"),
    "anchor_ambiguous": Code(_F, "the edit's anchor occurs more than once"),
    "file_missing": Code(_F, "the edit's target file does not exist"),
    "merged_marker": Code(_F, "the edit's merged marker is present: upstream merged it"),
    "merged_file": Code(_F, "a create target already exists with the created content"),
    "create": Code(_F, "the file will be created"),
    "create_exists": Code(_F, "a create target already exists with other content"),
    "group_unmatched": Code(_F, "no member of a one_of group matches"),
    "group_ambiguous": Code(_F, "more than one member of a one_of group matches"),
    "group_other_member": Code(_F, "another member of the one_of group matched"),
    "conflict": Code(_F, "an earlier patch consumed the edit's anchor (ordering, not drift)"),
    # -- manifest and preflight -----------------------------------------------------------------
    "manifest_missing": Code(_B, "the pin manifest does not exist"),
    "manifest_corrupt": Code(_B, "the pin manifest is not valid"),
    "tree_patched": Code(_B, "a manifest needs a pristine tree: this one is patched by sndr and has no pristine view "
                             "(a pending journal, a stored copy missing, a file patched under another vLLM version)"),
    "tree_required": Code(_B, "--tree is required to pick one of several manifests"),
    "anchors_not_a_dir": Code(_B, "manifest check --anchors names a file (or FIFO, device), not the directory of the "
                                  "manifests (vllm-<version>.json)"),
    "bad_fail_on": Code(_B, "--fail-on names an unknown verdict"),
    "bad_config": Code(_B, "a config-drift watch file is malformed"),
    "bad_toml": Code(_B, "a TOML input is not valid"),
    "config_missing": Code(_B, "a config-drift watch file does not exist"),
    "config_unreadable": Code(_B, "a config-drift watch file cannot be read"),
    "bad_via": Code(_B, "--via names no release, or a release not strictly between the pin and the candidate"),
    "via_unavailable": Code(_B, "--via auto cannot list the releases in between (offline, or the index has none)"),
    "same_tree": Code(_B, "preflight: the pin and the candidate are the same tree (one version, the same files): "
                          "every patch would trivially still apply, which proves nothing about a bump"),
    "same_version": Code(_B, "preflight: the pin and the candidate are one vLLM version with other files (two builds of "
                             "one release, not a bump); a warning on stderr and in the report's warnings: it runs "
                             "(pin advance refuses the report: not_a_bump)"),
    "stdout_conflict": Code(_B, "two outputs of one command were both sent to stdout"),
    "output_refused": Code(_B, "an output path is a symlink, FIFO, device, directory or another user's file, or its "
                               "directory takes no new file (an --out DIR, --to DIR: a symlink or not a directory)"),
    # -- upstream: watchlist, sync, pin, vendor ---------------------------------------------------
    "bad_watchlist": Code(_B, "the watchlist does not match its schema"),
    "truncated_watchlist": Code(_B, "the watchlist's sentinel line is missing (truncated file)"),
    "yaml_syntax": Code(_B, "a YAML file is malformed"),
    "ambiguous_row": Code(_B, "a watchlist selector matches more than one row"),
    "no_such_row": Code(_B, "a watchlist selector matches no row"),
    "bad_selector": Code(_B, "a watchlist selector is malformed"),
    "not_a_bump": Code(_B, "pin advance: the preflight report's warnings carry same_version (its pin and candidate "
                           "are two builds of one vLLM version): no evidence for a bump, the pin is not advanced"),
    "unknown_key": Code(_B, "a watchlist edit names a key rows do not have"),
    "bad_value": Code(_B, "a watchlist edit's value has the wrong type"),
    "bad_preflight": Code(_B, "a preflight report given as input is malformed"),
    "bad_json": Code(_B, "a JSON input is malformed"),
    "bad_pin": Code(_B, "the pin record is malformed"),
    "bad_queue": Code(_B, "a sync queue given as input is malformed"),
    "bad_select": Code(_B, "--select names no commit or more than one"),
    "bad_sync_config": Code(_B, "the sync configuration is malformed"),
    "bad_target": Code(_B, "the sync target is missing or empty"),
    "bad_decisions": Code(_B, "the sync decisions file is malformed"),
    "not_a_repo": Code(_B, "the path is not a git repository"),
    "bare_repo": Code(_B, "sync plan: a bare repository has no work tree to judge the commits on (pass --tree)"),
    "tree_not_pin": Code(_B, "sync plan: the tree's vLLM version is not the pin's"),
    "tree_empty": Code(_B, "sync plan: none of the mirrored files is in the tree"),
    "repo_not_found": Code(_B, "the repository does not exist"),
    "unknown_rev": Code(_B, "a revision is not a commit in the repository"),
    "not_ancestor": Code(_B, "--from is not an ancestor of --to"),
    "backwards_range": Code(_B, "sync plan: --to is an ancestor of --from, so the range FROM..TO is empty"),
    "no_merge_base": Code(_B, "--from and --to share no history (not commits of one repository)"),
    "no_version": Code(_B, "the pin record needs a version"),
    "shipped_data_write": Code(_B, "a file to write defaults into an installed sndr's shipped data (pass --patches/--decisions)"),
    "revert_pair_half_ported": Code(_F, "one half of an in-range revert pair is ported"),
    "revert_pair_split": Code(_F, "a revert pair inside the range is split across waves"),
    "series_split": Code(_F, "a commit's in-range dependencies are not queued with it"),
    "bad_diff": Code(_B, "a unified diff is malformed"),
    "diff_unreadable": Code(_B, "the diff cannot be read"),
    "bad_id": Code(_B, "a patch id is malformed"),
    "bad_marker": Code(_B, "--marker names no edit of the patch"),
    "bad_vllm_spec": Code(_B, "a vllm version specifier excludes the pin"),
    "binary_file": Code(_B, "a diff changes a binary file"),
    "create_empty": Code(_B, "a diff creates an empty file"),
    "deleted_file": Code(_B, "a diff deletes a file, which sndr never does"),
    "renamed_file": Code(_B, "a diff renames a file, which sndr never does"),
    "file_emptied": Code(_B, "a diff empties a file"),
    "hunk_not_found": Code(_B, "a diff hunk's pre-image is not in the tree"),
    "anchor_not_unique": Code(_B, "a diff hunk cannot be given a unique anchor"),
    "no_title": Code(_B, "a vendored patch needs a title"),
    "nothing_to_vendor": Code(_B, "a diff has no change inside vllm/"),
    "patch_exists": Code(_B, "the patch file to write already exists"),
    "verify_failed": Code(_F, "planning a vendored patch on the pin fails"),
    "verify_mismatch": Code(_F, "a vendored patch does not reproduce the diff's post-image"),
    "verify_not_applied": Code(_F, "a vendored edit does not read applied on the post-image"),
    "import_no_series": Code(_B, "sndr import found no series (quilt series file, *.patch files) or an empty one"),
    "import_bad_series": Code(_B, "a quilt series line has an option sndr import does not understand"),
    "import_unreadable": Code(_B, "sndr import cannot read a series file or a patch it names"),
    # -- GDN replayed spec verify (sndr/kernels/gdn/replay.py): why a batch keeps vLLM's snapshots --
    "gdn_replay_prefix_caching": Code(_F, "GDN replay: mamba_cache_mode 'align' copies snapshot blocks between steps"),
    "gdn_replay_mixed_batch": Code(_F, "GDN replay: prefills or plain decodes in the batch read snapshots"),
    "gdn_replay_kv_transfer": Code(_F, "GDN replay: a KV connector or state offload reads snapshot slots"),
    "gdn_replay_unsupported": Code(_F, "GDN replay: state dtype, layout, heads, device or T outside the kernel's set"),
    # -- internal -------------------------------------------------------------------------------
    "internal": Code(_I, "a bug in sndr; please report it with the traceback"),
    "interrupted": Code(130, "the command was interrupted (Ctrl-C); its last line says what state it left"),
}


def registered_exit(code: str, default: int = EXIT_BAD_INPUT) -> int:
    """The exit status registered for ``code`` (``default`` for an unregistered one)."""
    entry = CODES.get(code)
    return entry.exit if entry is not None else default
