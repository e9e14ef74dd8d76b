"""A realistic patch stack on real vLLM 0.32.0 files, written as patch TOML files (issue 16).

``write_stack(pin, directory)`` writes about 50 patch files:

* hot spot A (``BlockPool.get_new_blocks``): HA1 -> HA2 -> HA3 -> HA4 stacked in a fixed
  order by ``after`` (declared in reverse file order), each anchoring on text the previous
  one produced; HA6 inserts at the edge of HA1's anchor, unordered;
* hot spot B (``BlockPool.free_blocks``): HB1 rewrites one line of a two-line anchor and
  re-emits the other; HB2 anchors on that re-emitted line (unordered);
  HB3 (opt-in) changes the same bytes as HB1: a true conflict;
* ``CacheConfig.cache_dtype``: CC1 inserts after the line; CC2 (opt-in) anchors across CC1's
  insertion point (an ordering conflict: the other order works); CC4 (opt-in) rewrites the
  line CC1 produced without being ordered after it: the second true conflict;
* VA1: a ``one_of`` group of two anchor variants (0.32.0's text and an older spelling);
* W1..W6: opt-in by ``when`` (kv_cache_dtype, gpu_capability, model_arch, spec_method,
  platform, quantization);
* N1: every edit optional and absent (nothing to do);
* K1 (skip, drifted) <- K2 (requires K1), K3 (fail, drifted): opt-in failure-policy cases;
* ``P23_WIRE-1``: an opt-in id whose variable is ``SNDR_ENABLE_P23_WIRE_1``;
* G*: pairs of unordered insertions before and after one real def line, over 12 more files.

Every anchor is exact text of the pinned tree (or, for the variant and drift cases, text that
is deliberately absent). ``PROFILE`` is a deployment profile that W1-W4 and W6 match and W5
does not.
"""

from __future__ import annotations

import re
from pathlib import Path

BLOCK_POOL = "vllm/v1/core/block_pool.py"
CACHE = "vllm/config/cache.py"
SCHED = "vllm/v1/core/sched/scheduler.py"

PROFILE = """\
name = "prod-h200"
model_arch = "Qwen3NextForCausalLM"
quantization = "fp8"
kv_cache_dtype = "fp8_e4m3"
spec_method = "mtp"
platform = "cuda"
gpu_capability = "9.0"
"""

_DEF = re.compile(r"^ *(?:async def|def|class) [A-Za-z_][A-Za-z0-9_]*[(:].*$", re.M)

POP = "        ret: list[KVCacheBlock] = self.free_block_queue.popleft_n(num_blocks)\n"
HB_ANCHOR = "            block.ref_cnt -= 1\n            if block.ref_cnt == 0 and not block.is_null:\n"
HB_NEXT = "                if block.block_hash is None or not self.enable_caching:\n"
CC_LINE = '    cache_dtype: CacheDType = "auto"\n'
CC_NEXT = '    """Data type for kv cache storage. If "auto", will use model data type.\n'

# Patches that are default = false: tests enable them one at a time.
OPT_IN = ("HB3", "CC2", "CC4", "K1", "K2", "K3", "P23_WIRE-1")
WHEN_IDS = ("W1", "W2", "W3", "W4", "W5", "W6")


def _lit(text: str) -> str:
    assert "'''" not in text
    return "'''\n" + text + "'''"


def patch_toml(pid: str, title: str, files: dict[str, list[tuple[str, str, str]]], *, top: str = "",
               edit_extra: dict[str, str] | None = None) -> str:
    """One patch file. ``files``: path -> [(edit name, anchor, replacement)]."""
    out = [f'id = "{pid}"', f'title = "{title}"']
    if top:
        out.append(top.strip())
    for path, edits in files.items():
        out += ["", "[[files]]", f'path = "{path}"']
        for name, anchor, repl in edits:
            out += ["", "[[files.edits]]", f'name = "{name}"', f"anchor = {_lit(anchor)}",
                    f"replacement = {_lit(repl)}"]
            if edit_extra and name in edit_extra:
                out.append(edit_extra[name])
    return "\n".join(out) + "\n"


def unique_defs(text: str) -> list[str]:
    lines = [m.group(0) + "\n" for m in _DEF.finditer(text)]
    return [ln for ln in lines if text.count(ln) == 1]


def filler_files(pin: Path, n: int = 12) -> list[str]:
    out = []
    for p in sorted((pin / "vllm" / "v1").rglob("*.py")):
        rel = str(p.relative_to(pin))
        if rel in (BLOCK_POOL, SCHED):
            continue
        text = p.read_text()
        if 5_000 < len(text) < 200_000 and len(unique_defs(text)) >= 4:
            out.append(rel)
        if len(out) == n:
            break
    return out


def write_stack(pin: Path, directory: Path) -> dict[str, str]:
    """Write the stack into ``directory``; returns id -> file name."""
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}

    def put(name: str, pid: str, text: str) -> None:
        (directory / name).write_text(text)
        files[pid] = name

    bp = (pin / BLOCK_POOL).read_text()
    assert bp.count(POP) == 1 and bp.count(HB_ANCHOR) == 1 and bp.count(HB_ANCHOR + HB_NEXT) == 1
    cache = (pin / CACHE).read_text()
    assert cache.count(CC_LINE + CC_NEXT) == 1

    # Hot spot A, declared in reverse file order: `after` alone fixes the order.
    ha1 = "        # HA1: popped from the free queue\n"
    ha2 = "        # HA2: stacked on HA1\n"
    ha3 = "        # HA2: stacked on HA1 (amended by HA3)\n"
    put("S001-ha4.toml", "HA4", patch_toml("HA4", "HA4 adds after HA1 and HA3's lines",
                                           {BLOCK_POOL: [("more", ha1 + ha3, ha1 + ha3 + "        # HA4: last\n")]},
                                           top='after = ["HA3"]'))
    put("S002-ha3.toml", "HA3", patch_toml("HA3", "HA3 rewrites the line HA2 produced",
                                           {BLOCK_POOL: [("amend", ha2, ha3)]}, top='after = ["HA2"]'))
    put("S003-ha2.toml", "HA2", patch_toml("HA2", "HA2 anchors on HA1's line",
                                           {BLOCK_POOL: [("stack", ha1, ha1 + ha2)]}, top='after = ["HA1"]'))
    put("S004-ha1.toml", "HA1", patch_toml("HA1", "HA1 inserts after popleft_n",
                                           {BLOCK_POOL: [("pop", POP, POP + ha1)]}))
    put("S005-ha6.toml", "HA6", patch_toml("HA6", "HA6 inserts before HA1's anchor (unordered)",
                                           {BLOCK_POOL: [("edge", POP, "        # HA6: before popleft_n\n" + POP)]}))

    # Hot spot B: re-emitted context, and one true same-byte conflict (opt-in).
    hb1 = HB_ANCHOR.replace("-= 1\n", "-= 1  # HB1\n", 1)
    put("S010-hb1.toml", "HB1", patch_toml("HB1", "HB1 rewrites the decrement, re-emits the if",
                                           {BLOCK_POOL: [("dec", HB_ANCHOR, hb1)]}))
    if_line = "            if block.ref_cnt == 0 and not block.is_null:\n"
    put("S011-hb2.toml", "HB2", patch_toml("HB2", "HB2 anchors on the line HB1 re-emits",
                                           {BLOCK_POOL: [("ctx", if_line + HB_NEXT,
                                                          if_line + "                # HB2: context HB1 re-emits\n"
                                                          + HB_NEXT)]}))
    put("S012-hb3.toml", "HB3", patch_toml("HB3", "HB3 changes the bytes HB1 changes",
                                           {BLOCK_POOL: [("dec3", HB_ANCHOR,
                                                          HB_ANCHOR.replace("-= 1\n", "-= 1  # HB3\n", 1))]},
                                           top="default = false"))

    # CacheConfig.cache_dtype: an ordering conflict and a second true conflict (both opt-in).
    cc1 = "    # CC1: stacked note\n"
    put("S020-cc1.toml", "CC1", patch_toml("CC1", "CC1 inserts after cache_dtype",
                                           {CACHE: [("note", CC_LINE, CC_LINE + cc1)]}))
    put("S021-cc2.toml", "CC2", patch_toml("CC2", "CC2 anchors across CC1's insertion point",
                                           {CACHE: [("doc", CC_LINE + CC_NEXT,
                                                     CC_LINE + CC_NEXT.replace("Data type", "Data type (CC2)"))]},
                                           top="default = false"))
    put("S022-cc4.toml", "CC4", patch_toml("CC4", "CC4 rewrites CC1's line without ordering",
                                           {CACHE: [("renote", cc1, "    # CC4: rewrote CC1's note\n")]},
                                           top="default = false"))

    # Variant anchors: one_of (0.32.0's text, and an older spelling that is absent).
    sched = (pin / SCHED).read_text()
    sdefs = unique_defs(sched)
    v_line = sdefs[3]
    ind = v_line[: len(v_line) - len(v_line.lstrip())]
    older = v_line.replace("def ", "def _old_", 1)
    put("S030-va1.toml", "VA1", patch_toml("VA1", "VA1 anchor variants",
                                           {SCHED: [("new", v_line, v_line + f"{ind}    # VA1 (0.32 spelling)\n"),
                                                    ("old", older, older + f"{ind}    # VA1 (old spelling)\n")]},
                                           top='groups = { variants = "one_of" }',
                                           edit_extra={"new": 'group = "variants"', "old": 'group = "variants"'}))

    # Opt-in by `when`.
    whens = {
        "W1": 'when = { kv_cache_dtype = "fp8*" }',
        "W2": 'when = { gpu_capability = ">=8.9" }',
        "W3": 'when = { model_arch = ["Qwen3NextForCausalLM", "Qwen3MoeForCausalLM"] }',
        "W4": 'when = { spec_method = "mtp" }',
        "W5": 'when = { platform = "rocm" }',
        "W6": 'when = { quantization = ["fp8", "modelopt"], platform = "cuda" }',
    }
    for k, (pid, top) in enumerate(whens.items()):
        line = sdefs[5 + k]
        ind = line[: len(line) - len(line.lstrip())]
        put(f"S04{k}-{pid.lower()}.toml", pid,
            patch_toml(pid, f"{pid} opt-in by when", {SCHED: [("w", line, line + f"{ind}    # {pid}\n")]}, top=top))

    # Nothing to do: every edit optional and absent.
    put("S050-n1.toml", "N1", patch_toml("N1", "N1 only optional edits, all absent",
                                         {SCHED: [("opt", "    def no_such_method_in_vllm(self):\n",
                                                   "    def no_such_method_in_vllm(self):  # N1\n")]},
                                         edit_extra={"opt": "required = false"}))

    # Failure policy (opt-in).
    gone = "        this_line_is_not_in_vllm = True\n"
    line = sdefs[12]
    ind = line[: len(line) - len(line.lstrip())]
    put("S060-k1.toml", "K1", patch_toml("K1", "K1 drifted, on_failure = skip",
                                         {SCHED: [("gone", gone, gone + "        # K1\n")]},
                                         top='default = false\non_failure = "skip"'))
    put("S061-k2.toml", "K2", patch_toml("K2", "K2 requires K1",
                                         {SCHED: [("k2", line, line + f"{ind}    # K2\n")]},
                                         top='default = false\nrequires = ["K1"]'))
    put("S062-k3.toml", "K3", patch_toml("K3", "K3 drifted, on_failure = fail",
                                         {CACHE: [("gone", gone, gone + "        # K3\n")]}, top="default = false"))
    line = sdefs[14]
    ind = line[: len(line) - len(line.lstrip())]
    put("S063-p23.toml", "P23_WIRE-1", patch_toml("P23_WIRE-1", "an id with a dash",
                                                  {SCHED: [("p23", line, line + f"{ind}    # P23\n")]},
                                                  top="default = false"))

    # Pairs of unordered insertions at the two edges of one real def line.
    for i, rel in enumerate(filler_files(pin)):
        text = (pin / rel).read_text()
        line = unique_defs(text)[1]
        ind = line[: len(line) - len(line.lstrip())]
        put(f"S1{i:02d}a-g{i}.toml", f"G{i:02d}A", patch_toml(f"G{i:02d}A", f"after a def in {rel}",
                                                            {rel: [("after", line, line + f"{ind}    # G{i:02d}A\n")]}))
        put(f"S1{i:02d}b-g{i}.toml", f"G{i:02d}B", patch_toml(f"G{i:02d}B", f"before a def in {rel}",
                                                            {rel: [("before", line, f"{ind}# G{i:02d}B\n" + line)]}))
    return files


def stack_paths(pin: Path) -> list[str]:
    return [BLOCK_POOL, CACHE, SCHED] + filler_files(pin)
