"""Regenerate the preflight test patch sets from the cached real vLLM trees.

    python tests/data/preflight/make_sets.py

Every anchor is cut from real code of the pin (vLLM 0.32.0, or 0.10.0 for the
older pair) by a distinctive first line and a line count, so the sets stay
honest: nothing here is made up except the replacement comments. The TOML
files are committed; this script documents how they were made and checks
that each cut is unique on the pin.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from sndr.binding import find_binding  # noqa: E402
from sndr.model import Edit, FileEdits, Patch, RuntimeEdit  # noqa: E402
from sndr.tomlwrite import dumps_patch  # noqa: E402
from sndr.tree import fetch_version  # noqa: E402

KU = "vllm/v1/core/kv_cache_utils.py"
KM = "vllm/v1/core/kv_cache_manager.py"
BP = "vllm/v1/core/block_pool.py"


class Src:
    def __init__(self, version: str):
        self.root = fetch_version(version)

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")

    def cut(self, rel: str, first: str, n: int, nth: int = 0) -> str:
        """``n`` lines of ``rel`` starting at the ``nth`` line that contains ``first``."""
        lines = self.text(rel).split("\n")
        hits = [i for i, ln in enumerate(lines) if first in ln]
        if len(hits) <= nth:
            raise SystemExit(f"{rel}: {first!r} not found")
        i = hits[nth]
        return "\n".join(lines[i:i + n]) + "\n"


def note(anchor: str, text: str) -> str:
    """An insertion: the anchor plus a comment line at the last line's indentation."""
    last = [ln for ln in anchor.split("\n") if ln.strip()][-1]
    indent = last[: len(last) - len(last.lstrip())]
    return anchor + f"{indent}# sndr-test: {text}\n"


def text_patch(pid: str, title: str, path: str, *edits: Edit, **kw) -> Patch:
    return Patch(id=pid, title=title, files=[FileEdits(path=path, edits=list(edits))], **kw)


def edit(name: str, anchor: str, replacement: str | None = None, **kw) -> Edit:
    return Edit(name=name, anchor=anchor, replacement=replacement or note(anchor, name), **kw)


def bump_032_033() -> list[tuple[Patch, str]]:
    p, c = Src("0.32.0"), Src("0.33.0")
    out: list[tuple[Patch, str]] = []

    def add(patch: Patch, why: str) -> None:
        out.append((patch, why))

    # -- survivors
    add(text_patch("PF01", "Trace popleft of the free block queue", KU,
                   edit("popleft", p.cut(KU, "if self.fake_free_list_head.next_free_block is", 3))),
        "survives: unchanged code in a file that lost half its code")
    add(text_patch("PF02", "Guard the free block count", BP,
                   edit("free", p.cut(BP, "def get_num_free_blocks(self) -> int:", 2))),
        "survives in a file edited elsewhere")
    # -- moved to vllm/v1/core/kv_cache_planning.py (new in 0.33.0)
    add(text_patch("PF03", "Explain the KV memory shortfall", KU,
                   edit("shortfall", p.cut(KU, "    needed_memory = get_needed_memory()", 4))),
        "moved verbatim to kv_cache_planning.py")
    add(text_patch("PF04", "Trace fits_in_memory", KU,
                   edit("fits", p.cut(KU, "# Temporarily modify the max_model_len for this calculation", 4))),
        "moved verbatim (nested function) to kv_cache_planning.py")
    add(text_patch("PF05", "Check merged layer specs", KU,
                   edit("page", p.cut(KU, "    for layer_names_one_group in grouped_layer_names:", 6))),
        "moved verbatim to kv_cache_planning.py")
    add(text_patch("PF06", "Track the limiting worker", KU,
                   edit("worker", p.cut(KU, "    for groups, avail_mem in zip(projected_groups_per_worker", 7))),
        "moved to kv_cache_planning.py and edited there (builder argument)")
    # -- edited upstream, same file
    add(text_patch("PF07", "Count extra-key computations", KU,
                   edit("extra", p.cut(KU, "# MM and LoRA requests need extra keys for block-hash computation.", 4))),
        "edited in place (now inside an else branch)")
    add(text_patch("PF08", "Document get_computed_blocks", KM,
                   edit("sig", p.cut(KM, "    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:", 2))),
        "edited in place (signature gained max_cache_hit_length)")
    add(text_patch("PF09", "Clamp the cache hit", KM,
                   edit("clamp", p.cut(KM, "# could slightly improve performance in the future.", 2))),
        "edited in place (default moved under an if)")
    # -- deleted upstream
    add(text_patch("PF10", "Recognise more MTP drafters", KU,
                   edit("mtp", p.cut(KU, '    if spec_config.method == "mtp":', 4))),
        "deleted upstream (_uses_trailing_mtp_layers is gone)")
    add(text_patch("PF11", "Check the group partition", KU,
                   edit("partition", p.cut(KU, "    names = [name for group in kv_cache_groups for name in group.layer_names]", 2))),
        "deleted upstream (_groups_partition_layers_exactly is gone)")
    # -- backports whose replacement is the 0.33.0 text
    a = p.cut(KU, "        num_tokens = request.num_tokens", 1)
    add(text_patch("PF12", "Backport: lookahead-aware hash token count", KU,
                   edit("lookahead", a, c.cut(KU, "        num_tokens = request.num_tokens - num_hash_lookahead_tokens", 1),
                        merged_markers=["num_tokens = request.num_tokens - num_hash_lookahead_tokens"]),
                   upstream=["vllm#90001"]),
        "backport with an edit merged marker: merged on 0.33.0")
    add(Patch(id="PF13", title="Backport: skip the null head of a block table", upstream=["vllm#90002"],
              merged_markers=["trim_null_head("],
              files=[FileEdits(path=KM, edits=[
                  edit("import", p.cut(KM, "from vllm.v1.core.kv_cache_utils import KVCacheBlock, KVCacheBlockCopy", 1),
                       c.cut(KM, "from vllm.v1.core.kv_cache_utils import KVCacheBlock, KVCacheBlockCopy, trim_null_head", 1)),
                  edit("use", p.cut(KM, "                for block in group", 1),
                       c.cut(KM, "                for block in trim_null_head(group)", 1)),
              ])]),
        "backport with a patch-level marker: the whole patch retires")
    add(text_patch("PF14", "Backport: lookahead argument (no marker)", KM,
                   edit("arg", p.cut(KM, "        use_eagle: bool = False,", 2, nth=0),
                        c.cut(KM, "        use_eagle: bool = False,", 3, nth=0))),
        "backport without a marker: replacement present upstream -> applied")
    # -- chains
    prod = p.cut(KU, "    return sum(spec.max_memory_usage_bytes(vllm_config) for spec in kv_cache_specs)", 1)
    prod_rep = prod.replace("    return sum(", "    total = sum(").rstrip("\n") + "\n    return total\n"
    add(text_patch("PF15", "Name the memory total", KU, edit("total", prod, prod_rep)),
        "producer that drifts (max_memory_usage_bytes moved)")
    add(text_patch("PF16", "Log the memory total", KU,
                   edit("log", "    return total\n", "    logger.debug(\"sndr-test: %d\", total)\n    return total\n"),
                   requires=["PF15"]),
        "dependent whose anchor lies in PF15's replacement: broken by the chain")
    surv = p.cut(KU, "def get_kv_cache_capacity(", 2)
    add(text_patch("PF17", "Capacity probe", KU,
                   edit("probe", surv, surv + "    # sndr-test: capacity probe\n"),
                   merged_markers=["def null_head_len("]),
        "producer whose merged marker appears on 0.33.0 (retires)")
    add(text_patch("PF18", "Capacity probe detail", KU,
                   edit("detail", "    # sndr-test: capacity probe\n",
                        "    # sndr-test: capacity probe (detail)\n"),
                   requires=["PF17"]),
        "dependent of a producer that retires upstream: broken by the chain")
    # -- optional edit that stops matching: a soft-skip the report must not hide
    add(text_patch("PF19", "Count reconciled lookups", KM,
                   edit("reconcile", p.cut(KM, "            # that every group agrees on.", 2), required=False)),
        "optional edit on code edited upstream -> optional_absent (soft-skip)")
    # -- ambiguous on the candidate
    add(text_patch("PF20", "Validate turboquant modes", "vllm/v1/kv_cache_interface.py",
                   edit("mode", p.cut("vllm/v1/kv_cache_interface.py", "        return KVQuantMode[kv_cache_dtype.upper()]", 1))),
        "unique on the pin, twice on the candidate -> ambiguous")
    # -- survives in another enclosing scope
    fm = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py"
    add(text_patch("PF21", "Trace the sparse MLA decode kernel", fm,
                   edit("kernel", p.cut(fm, "        kernel_out = trtllm_batch_decode_with_kv_cache_mla(", 3))),
        "survives, but its method was renamed (_run_mqa_kernel -> _forward_mqa_kernel)")
    # -- one_of group whose variant switches
    add(Patch(id="PF22", title="Event extra keys", groups={"variant": "one_of"},
              files=[FileEdits(path=BP, edits=[
                  edit("v032", p.cut(BP, "                extra_keys, curr_mm_idx = generate_block_hash_extra_keys(", 1),
                       group="variant"),
                  edit("v033", c.cut(BP, "                extra_keys, curr_mm_idx = self._generate_event_extra_keys(", 1),
                       group="variant"),
              ])]),
        "one_of variants: the pin matches v032, the candidate v033")
    # -- runtime patches checked statically
    hasher = find_binding(p.text(KU), "get_request_block_hasher", KU)
    hbt = find_binding(p.text(KU), "hash_block_tokens", KU)
    add(Patch(id="PF23", title="Runtime wrappers on kv_cache_utils", kind="runtime", runtime=[
        RuntimeEdit(name="hasher", target="vllm.v1.core.kv_cache_utils:get_request_block_hasher",
                    replacement="sndr.kernels.testing:hasher", signature=hasher.signature),
        RuntimeEdit(name="estimate", target="vllm.v1.core.kv_cache_utils:estimate_max_model_len",
                    replacement="sndr.kernels.testing:estimate"),
        RuntimeEdit(name="hash", target="vllm.v1.core.kv_cache_utils:hash_block_tokens",
                    replacement="sndr.kernels.testing:hash_block_tokens", signature=hbt.signature),
    ]), "runtime targets: signature changed, moved out of the module, unchanged")
    # -- markers that go away: newly reverted
    add(text_patch("PF24", "Annotate eagle groups (merged on the pin)", KU,
                   edit("eagle", p.cut(KU, "def get_none_hash_seed() -> str:", 1),
                        merged_markers=["def _uses_trailing_mtp_layers("])),
        "marker present on the pin only -> newly_reverted; merged -> applies")
    # -- version range excludes the candidate
    add(text_patch("PF25", "Pin-only tweak (range excludes the candidate)", KU,
                   edit("tweak", p.cut(KU, "def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:", 1)),
                   vllm="<0.33"),
        "turned off on the candidate by its range; would still apply")
    add(text_patch("PF26", "Pin-only fix on moved code", KU,
                   edit("moved", p.cut(KU, "def is_kv_cache_type_attention_free(", 2)),
                   vllm=">=0.32,<0.33"),
        "turned off on the candidate by its range; would drift (moved)")
    # -- files that are gone on the candidate
    cli = "vllm/entrypoints/launchers/cli_args.py"
    add(text_patch("PF27", "Default the launcher port", cli,
                   edit("port", p.cut(cli, "def make_arg_parser(", 1))),
        "file renamed to vllm/entrypoints/common/cli_args.py")
    chat = "vllm/renderers/chat_utils.py"
    add(text_patch("PF28", "Trace chat content parsing", chat,
                   edit("parse", p.cut(chat, "def _parse_chat_message_content_part(", 1))),
        "file split into the vllm/renderers/chat_utils/ package")
    # -- a created file
    add(Patch(id="PF29", title="Ship a probe module",
              files=[FileEdits(path="vllm/sndr_probe.py", create='"""sndr-test probe."""\n')]),
        "creates a file: applies on both")
    return out


def bump_0100_0101() -> list[tuple[Patch, str]]:
    p = Src("0.10.0")
    cfg = "vllm/config.py"
    out = []
    out.append((text_patch("PQ01", "Explain fp8 KV cache", cfg,
                           edit("fp8", p.cut(cfg, '                "Using fp8 data type to store kv cache. It reduces the GPU "', 3))),
                "CacheConfig._verify_cache_dtype: config.py became a package (config/cache.py)"))
    out.append((text_patch("PQ02", "Seed check for external launcher", cfg,
                           edit("seed", p.cut(cfg, '        if parallel_config.distributed_executor_backend == "external_launcher":', 3))),
                "ModelConfig.verify_with_parallel_config: now in config/__init__.py"))
    out.append((text_patch("PQ03", "Swap space message", cfg,
                           edit("swap", p.cut(cfg, "        total_cpu_memory = get_cpu_memory()", 4))),
                "CacheConfig.verify_with_parallel_config: now in config/cache.py"))
    out.append((text_patch("PQ04", "General plugins", "vllm/plugins/__init__.py",
                           edit("plugins", p.cut("vllm/plugins/__init__.py", "def load_general_plugins():", 1))),
                "survives"))
    return out


def write(dest: Path, patches: list[tuple[Patch, str]]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.toml"):
        old.unlink()
    for patch, why in patches:
        slug = "".join(ch if ch.isalnum() else "-" for ch in patch.title.lower()).strip("-")[:40].rstrip("-")
        (dest / f"{patch.id}-{slug}.toml").write_text(dumps_patch(patch, header=why), encoding="utf-8")


if __name__ == "__main__":
    write(HERE / "bump_032_033", bump_032_033())
    write(HERE / "bump_0100_0101", bump_0100_0101())
    print("written")
