"""Issue 31, a migration path: ``python -m sndr import genesis SRC --to DIR``.

The seed system's patchers are Python modules built on ``TextPatcher``/``TextPatch`` with a
registry of metadata. The modules here are written for these tests in that shape (the project
holds no third-party code); the converter reads them statically and must say, with file and line,
everything it cannot express.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sndr.load import load_patch_set
from sndr.plan import build_plan
from sndr.upstream.genesis import boot_order, convert

SCHED = "vllm/v1/core/sched/scheduler.py"
SCHED_TEXT = '''\
class Scheduler:
    def schedule(self):
        budget = self.max_num_scheduled_tokens
        for request in self.waiting:
            num_new_tokens = request.num_tokens - request.num_computed_tokens
            num_new_tokens = min(num_new_tokens, budget)
            budget -= num_new_tokens
        return budget
'''
GDN_NEW_PATH = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
GDN_TEXT = "class QwenGDN:\n    def forward(self, x):\n        ssm_state = self.kv_cache[1]\n        return x\n"

REGISTRY = '''
PATCH_REGISTRY: dict[str, dict[str, Any]] = {
    "PN7": {
        "title": "Cap new tokens by the long-prefill threshold",
        "env_flag": "GENESIS_ENABLE_PN7", "default_on": False, "lifecycle": "experimental",
        "credit": "someone (vllm#123)", "upstream_pr": 123,
        "applies_to": {"is_hybrid": [True], "model_class": ["qwen3_5", "qwen3_next"], "is_turboquant": [True]},
        "vllm_version_range": (">=0.20.0", "<0.40.0"),
        "apply_module": "sndr.engines.vllm.patches.scheduler.pn7_cap",
    },
    "PN8": {
        "title": "Log the budget",
        "env_flag": "GENESIS_ENABLE_PN8", "default_on": True, "lifecycle": "stable",
        "credit": "", "conflicts_with": ["PZ9"], "requires_patches": ["PN7"],
        "apply_module": "sndr.engines.vllm.patches.scheduler.pn8_log",
    },
    "PN3": {
        "title": "GDN state copy",
        "env_flag": "GENESIS_ENABLE_PN3", "default_on": False, "lifecycle": "experimental", "credit": "",
        "applies_to": {"model_arch": ["*"]},
        "apply_module": "sndr.engines.vllm.patches.gdn.pn3_state",
    },
    "PN4": {
        "title": "Dynamic text", "env_flag": "X", "default_on": False, "lifecycle": "experimental", "credit": "",
        "apply_module": "sndr.engines.vllm.patches.misc.pn4_dynamic",
    },
    "PN5": {"title": "Docs only", "env_flag": "X", "default_on": False, "lifecycle": "experimental", "credit": ""},
    "PN6": {
        "title": "Runtime hook", "env_flag": "X", "default_on": False, "lifecycle": "retired", "credit": "",
        "apply_module": "sndr.engines.vllm.patches.misc.pn6_runtime",
    },
}
'''

PN7 = '''
from sndr.engines.vllm.detection.guards import resolve_vllm_file
from sndr.kernel import TextPatch, TextPatcher

_MIN = "            num_new_tokens = min(num_new_tokens, budget)\\n"
PN7_OLD = (
    "            num_new_tokens = request.num_tokens - request.num_computed_tokens\\n"
    + _MIN
)
PN7_NEW = PN7_OLD.replace("budget)", "budget, self.long_prefill_threshold)  # [PN7]")
BUDGET_OLD = "        budget = self.max_num_scheduled_tokens\\n"


def _make_patcher():
    target = resolve_vllm_file("v1/core/sched/scheduler.py")
    if target is None:
        return None
    return TextPatcher(
        patch_name="PN7", target_file=str(target), marker="Genesis PN7",
        sub_patches=[
            TextPatch(name="pn7_cap", anchor=PN7_OLD, replacement=PN7_NEW, required=True),
            TextPatch(name="pn7 budget comment", anchor=BUDGET_OLD,
                      replacement=f"        # [PN7] capped below\\n{BUDGET_OLD}",
                      upstream_merged_markers=["long_prefill_threshold)  # upstream"]),
        ],
        upstream_drift_markers=["def _cap_long_prefill("],
    )


def _make_patcher_for_fixture(fixture_path):
    # A build/test helper: its target is whatever the caller passes, not a vLLM file.
    return TextPatcher(patch_name="PN7 fixture", target_file=str(fixture_path), marker="Genesis PN7",
                       sub_patches=[TextPatch(name="pn7_cap", anchor=PN7_OLD, replacement=PN7_NEW)])
'''

PN8 = '''
from sndr.kernel import TextPatch, TextPatcher
from sndr.engines.vllm.detection.guards import resolve_vllm_file

# Written on the text PN7 produces.
OLD = "budget, self.long_prefill_threshold)  # [PN7]\\n"
NEW = OLD + "            logger.debug('budget %d', budget)  # [PN8]\\n"


COMMON = [TextPatch(name="pn8", anchor=OLD, replacement=NEW, required=True)]


def _make_patcher(target_file=None):
    if target_file is None:
        resolved = resolve_vllm_file("v1/core/sched/scheduler.py")
        if resolved is None:
            return None
        target_file = str(resolved)
    return TextPatcher(patch_name="PN8", target_file=target_file, marker="Genesis PN8", sub_patches=[*COMMON])
'''

PN3 = '''
import os
import textwrap
from sndr.kernel import TextPatch, TextPatcher
from sndr.engines.vllm.detection.guards import resolve_vllm_file

CORE_OLD = "        " + textwrap.dedent("""\\
    ssm_state = self.kv_cache[1]
""")
CORE_NEW = "".join(["        ssm_state = self.kv_cache[1]\\n", "        ssm_state = ssm_state.clone()  # [PN3]\\n"])
if os.environ.get("PN3_POST"):
    POST_OLD = "        ssm_state = ssm_state.contiguous()\\n"
else:
    POST_OLD = "        ssm_state = ssm_state.clone()\\n"


def build_sub_patches():
    return [
        TextPatch(name="pn3_core", anchor=CORE_OLD, replacement=CORE_NEW, required=True),
        TextPatch(name="pn3_post", anchor=POST_OLD, replacement=POST_OLD + "        # [PN3 post]\\n"),
    ]


def _make_patcher():
    target = (
        resolve_vllm_file("model_executor/layers/mamba/gdn_linear_attn.py")
        or resolve_vllm_file("model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py")
    )
    return TextPatcher(patch_name="PN3", target_file=str(target), marker="Genesis PN3",
                       sub_patches=build_sub_patches())
'''

PN4 = '''
from sndr.kernel import TextPatch, TextPatcher
from sndr.engines.vllm.detection.guards import resolve_vllm_file

import os

VERSION = os.environ.get("PN4_VERSION", "1")


def _make_patcher():
    return TextPatcher(patch_name="PN4", target_file=str(resolve_vllm_file("v1/core/sched/scheduler.py")),
                       marker="Genesis PN4",
                       sub_patches=[TextPatch(name="pn4", anchor="        return budget\\n",
                                              replacement=f"        return budget  # v{VERSION}\\n", required=True)])
'''

PN6 = '''
def apply():
    import vllm.v1.core.sched.scheduler as m
    m.Scheduler.schedule = lambda self: 0
'''


@pytest.fixture
def seed(tmp_path) -> Path:
    root = tmp_path / "seed"
    files = {"sndr/dispatcher/registry.py": "from typing import Any\n" + REGISTRY,
             "sndr/engines/vllm/patches/scheduler/pn7_cap.py": PN7,
             "sndr/engines/vllm/patches/scheduler/pn8_log.py": PN8,
             "sndr/engines/vllm/patches/gdn/pn3_state.py": PN3,
             "sndr/engines/vllm/patches/misc/pn4_dynamic.py": PN4,
             "sndr/engines/vllm/patches/misc/pn6_runtime.py": PN6}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_boot_order_puts_requires_first():
    assert boot_order({"B": {"requires_patches": ["C"]}, "A": {}, "C": {}}) == ["C", "B", "A"]


def test_convert_reads_patchers_and_registry_statically(seed):
    res = convert(seed, exists=lambda rel: rel == GDN_NEW_PATH)
    by = {p.id: p for p in res.patches}
    assert [p.id for p in res.patches] == ["PN7", "PN8", "PN3"]  # boot order
    pn7 = by["PN7"]
    assert (pn7.title, pn7.default, pn7.lifecycle, pn7.on_failure) == (
        "Cap new tokens by the long-prefill threshold", False, "experimental", "skip")
    assert pn7.upstream == ["vllm#123"] and pn7.vllm == ">=0.20.0,<0.40.0" and pn7.description == "someone (vllm#123)"
    assert pn7.when == {"is_hybrid": ["true"], "model_class": ["qwen3_5", "qwen3_next"]}
    (f,) = pn7.files
    assert f.path == SCHED and f.merged_markers == ["def _cap_long_prefill("]
    cap, comment = f.edits
    assert cap.name == "pn7_cap" and cap.required and "self.long_prefill_threshold)  # [PN7]" in cap.replacement
    assert comment.name == "pn7_budget_comment" and not comment.required  # the seed's default: optional
    assert comment.merged_markers == ["long_prefill_threshold)  # upstream"]
    pn8 = by["PN8"]
    assert pn8.requires == ["PN7"] and pn8.after == [] and pn8.conflicts == [] and pn8.lifecycle == "active"
    pn3 = by["PN3"]
    assert pn3.files[0].path == GDN_NEW_PATH and pn3.when == {"model_arch": ["*"]}
    assert [e.name for e in pn3.files[0].edits] == ["pn3_core"]  # the conditional variant is left out
    assert set(res.skipped) == {"PN4", "PN5", "PN6"}
    assert "no apply_module" in res.skipped["PN5"] and "no TextPatcher" in res.skipped["PN6"]
    notes = {(n.patch, n.file, n.line): n.what for n in res.notes}
    reg = seed / "sndr/dispatcher/registry.py"
    pn4 = "sndr/engines/vllm/patches/misc/pn4_dynamic.py"
    assert "f-string with a field known only at run time" in notes[("PN4", pn4, _line(PN4, "replacement=f\""))]
    assert "f-string" in res.skipped["PN4"]  # (PN7's f-string of module constants is read)
    pn3_rel = "sndr/engines/vllm/patches/gdn/pn3_state.py"
    assert "POST_OLD is bound under a condition" in notes[("PN3", pn3_rel, _line(PN3, "name=\"pn3_post\""))]
    assert any(p == "PN3" and "took " + GDN_NEW_PATH in w for (p, _, _), w in notes.items())
    reg_line = _line(reg.read_text(), '"PN7": {')
    assert "applies_to.is_turboquant has no sndr `when` key" in notes[("PN7", "sndr/dispatcher/registry.py", reg_line)]
    assert any(p == "PN8" and "conflicts_with names 'PZ9'" in w for (p, _, _), w in notes.items())
    pn7_rel = "sndr/engines/vllm/patches/scheduler/pn7_cap.py"
    fixture = notes[("PN7", pn7_rel, _line(PN7, 'return TextPatcher(patch_name="PN7 fixture"'))]
    assert "a TextPatcher whose target is not a vLLM file known statically" in fixture  # said, and left out
    assert [e.name for e in by["PN8"].files[0].edits] == ["pn8"]  # *COMMON, and the `if target_file is None` default


def test_cli_writes_a_set_that_stacks_in_boot_order(seed, tmp_path, capsys):
    from sndr.__main__ import main

    out = tmp_path / "out"
    rc = main(["import", "genesis", str(seed), "--to", str(out)])  # in process through the one entry
    err = capsys.readouterr().err
    assert rc == 1, err  # something was not expressible: a finding, all of it named
    assert "imported 3 patch(es), 4 edit(s) over 2 file(s)" in err
    assert "pn4_dynamic.py:" in err and "PN4: not imported" in err
    report = json.loads((out / "_import.json").read_text())
    assert report["patches"] == ["PN7", "PN8", "PN3"] and report["edits"] == 4
    ps = load_patch_set(out, packs=False)
    texts = {SCHED: SCHED_TEXT, "vllm/model_executor/layers/mamba/gdn_linear_attn.py": GDN_TEXT}
    env = {"SNDR_ENABLE_PN7": "1", "SNDR_ENABLE_PN3": "1"}
    from sndr.profile import parse_profile

    prof = parse_profile('is_hybrid = true\nmodel_class = "qwen3_next"\n', "p.toml")
    plan = build_plan(ps, texts.get, "0.32.0", environ=env, profile=prof)
    assert plan.ok, [p.render() for p in plan.problems]
    new = plan.changes[SCHED].new
    assert "# [PN7] capped below\n        budget =" in new
    assert "budget, self.long_prefill_threshold)  # [PN7]\n            logger.debug('budget %d', budget)  # [PN8]\n" in new
    assert "ssm_state = ssm_state.clone()  # [PN3]" in plan.changes["vllm/model_executor/layers/mamba/gdn_linear_attn.py"].new


def test_cli_to_a_symlinked_directory_is_refused_and_nothing_is_written(seed, tmp_path, capsys):
    """``import genesis SRC --to linkdir`` (linkdir -> a directory elsewhere) wrote the patch files and _import.json
    there: --to is the directory the user named, never written through a symlink (output_refused, exit 2)."""
    from sndr.__main__ import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    assert main(["import", "genesis", str(seed), "--to", str(link)]) == 2
    err = capsys.readouterr().err
    assert f"{link}: --to: it is a symlink to {elsewhere}" in err and "(output_refused)" in err, err
    assert list(elsewhere.iterdir()) == [] and link.is_symlink()
