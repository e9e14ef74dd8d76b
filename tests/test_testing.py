"""``sndr.testing``: the patch authors' harness asserts what a patch does, and says why when it does not."""

from __future__ import annotations

import pytest

from sndr.testing import assert_patch, load_patch, patched_texts, plan_patch, verdicts_on

PATCH = '''
id = "PT0001"
title = "Clamp the hit length"
default = false
merged_markers = ["min(hit_length, upstream_max)"]

[[files]]
path = "vllm/core.py"

[[files.edits]]
name = "clamp"
anchor = """
    curr_hit_length = hit_length
"""
replacement = """
    curr_hit_length = min(hit_length, max_hit)
"""

[[files.edits]]
name = "log"
required = false
anchor = """
    log(curr_hit_length)
"""
replacement = """
    log("hit", curr_hit_length)
"""
'''

BEFORE = "def f(hit_length, max_hit):\n    curr_hit_length = hit_length\n    return curr_hit_length\n"
AFTER = "def f(hit_length, max_hit):\n    curr_hit_length = min(hit_length, max_hit)\n    return curr_hit_length\n"


def test_before_after_and_verdicts():
    result = assert_patch(PATCH, before={"vllm/core.py": BEFORE}, after={"vllm/core.py": AFTER},
                          verdicts={"clamp": "applies", "log": "optional_absent"})
    assert result.id == "PT0001" and result.status == "applies"  # default = false is still tested


def test_a_wrong_after_fails_with_a_diff():
    with pytest.raises(AssertionError) as exc:
        assert_patch(PATCH, before={"vllm/core.py": BEFORE}, after={"vllm/core.py": AFTER.replace("max_hit)", "m)")})
    assert "--- expected/vllm/core.py" in str(exc.value) and "+    curr_hit_length = min(hit_length, max_hit)" in \
        str(exc.value)


def test_a_wrong_verdict_names_the_edit_and_both_verdicts():
    with pytest.raises(AssertionError) as exc:
        assert_patch(PATCH, before={"vllm/core.py": BEFORE}, verdicts={"clamp": "merged"})
    assert "'clamp': ('applies', 'merged')" in str(exc.value)
    with pytest.raises(AssertionError, match="no edit named"):
        assert_patch(PATCH, before={"vllm/core.py": BEFORE}, verdicts={"nope": "applies"})


def test_drift_and_merged_and_missing_files():
    drifted = BEFORE.replace("curr_hit_length = hit_length", "curr_hit_length = hit_length  # moved")
    r = assert_patch(PATCH, before={"vllm/core.py": drifted}, verdicts={"clamp": "drifted"}, status="failed")
    assert any(e.name == "clamp" and e.reason for e in r.edits)
    merged = BEFORE.replace("hit_length\n    return", "hit_length\n    # min(hit_length, upstream_max)\n    return")
    assert_patch(PATCH, before={"vllm/core.py": merged}, status="merged")
    assert verdicts_on(PATCH, {})["clamp"] == "file_missing"


def test_an_after_that_forgets_a_changed_file_fails():
    with pytest.raises(AssertionError, match=r"also changes \['vllm/core.py'\]"):
        assert_patch(PATCH, before={"vllm/core.py": BEFORE}, after={})


def test_reapply_catches_a_patch_that_is_not_idempotent():
    # The second edit rewrites the first one's output: applied once, the first edit then reads drifted.
    bad = PATCH.replace('name = "log"\nrequired = false\nanchor = """\n    log(curr_hit_length)\n"""\nreplacement = """\n'
                        '    log("hit", curr_hit_length)\n"""',
                        'name = "undo"\nanchor = """\nmin(hit_length, max_hit)\n"""\nreplacement = """\n'
                        'max_hit\n"""')
    assert 'name = "undo"' in bad
    with pytest.raises(AssertionError, match="re-planned on its own output"):
        assert_patch(bad, before={"vllm/core.py": BEFORE}, status="applies")


PLUGIN = PATCH.replace('default = false\n', 'default = false\nkind = "plugin"\nmodule = "sndr.runtime_patches"\n') + \
    """
[[runtime]]
name = "wrap-g"
target = "vllm.hooks:g"
replacement = "sndr.runtime_patches.sampling:wrap_apply_top_k_top_p"
wrap = true
"""
HOOKS = "def g(b):\n    return b\n"


def test_a_plugin_with_text_and_a_binding_passes_the_reapply_check():
    """A runtime binding is not read from the text: planned again on the patch's own output it still reads
    ``applies`` (each vLLM process installs it), which the re-apply check read as "not idempotent" for a
    patch with both text edits and bindings. Its text edits must still read applied, and the binding must
    still bind: one that the patch's own text edit breaks fails (the plan binds on the patched text)."""
    r = assert_patch(PLUGIN, before={"vllm/core.py": BEFORE, "vllm/hooks.py": HOOKS}, after={"vllm/core.py": AFTER},
                     verdicts={"clamp": "applies", "wrap-g": "applies"})
    assert r.status == "applies"
    breaks = '''
id = "PK0002"
title = "renames what its own binding wraps"
kind = "plugin"
module = "sndr.runtime_patches"

[[files]]
path = "vllm/hooks.py"

[[files.edits]]
name = "rename"
anchor = """
def g(b):
"""
replacement = """
def g2(b):
"""

[[runtime]]
name = "wrap-g"
target = "vllm.hooks:g"
replacement = "sndr.runtime_patches.sampling:wrap_apply_top_k_top_p"
wrap = true
'''
    with pytest.raises(AssertionError, match=r"wrap-g: drifted \(g not found in vllm/hooks.py\)"):
        assert_patch(breaks, before={"vllm/hooks.py": HOOKS}, status="applies")  # the plan binds on its output


def test_compile_errors_are_caught():
    broken = PATCH.replace("min(hit_length, max_hit)", "min(hit_length, max_hit", 1)
    with pytest.raises(AssertionError, match="compile"):
        assert_patch(broken, before={"vllm/core.py": BEFORE}, after={"vllm/core.py": AFTER})


def test_paths_text_and_models_are_all_accepted(tmp_path):
    f = tmp_path / "PT0001-clamp.toml"
    f.write_text(PATCH.lstrip())
    a, b, c = load_patch(str(f)), load_patch(f), load_patch(PATCH)
    assert a == b == c and load_patch(a) is a
    assert patched_texts(f, {"vllm/core.py": BEFORE}) == {"vllm/core.py": AFTER}
    assert plan_patch(f, {"vllm/core.py": BEFORE}, environ={}).patches[0].status == "gated"  # hermetic unless asked


def test_on_the_real_pin_tree(sndr_patch_on_pin):
    """The fixture: before texts come from the pinned vLLM 0.32.0 tree."""
    path = _shipped("PN0007")
    result = sndr_patch_on_pin(path, verdicts={e: "applies" for e in _edit_names("PN0007")})
    assert result.status == "applies" and sndr_patch_on_pin.version == "0.32.0"
    first = load_patch(path).files[0]
    sndr_patch_on_pin(path, contains={first.path: [first.edits[0].replacement.strip()]})


def _shipped(pid: str):
    from sndr.env import shipped_patches_dir

    [path] = sorted(shipped_patches_dir().glob(f"{pid}-*.toml"))
    return path


def _edit_names(pid: str) -> list[str]:
    return [e.name for f in load_patch(_shipped(pid)).files for e in f.edits]


@pytest.mark.parametrize("asked", [
    {"verdicts": {"clamp": "applies"}},  # the README's own example form: only verdicts
    {"contains": {"vllm/core.py": ["min(hit_length"]}},
    {"status": "applies"},
    {},  # nothing asked at all: still compiled
])
def test_a_replacement_that_does_not_compile_always_fails(asked):
    """Issue 32 MEDIUM 6: ``value=self.presence_penalty,,`` passed the harness with ``verdicts=`` alone,
    and apply refused it (compile_error)."""
    broken = PATCH.replace("min(hit_length, max_hit)", "min(hit_length, max_hit,,)", 1)
    with pytest.raises(AssertionError, match="does not compile .*compile_error"):
        assert_patch(broken, before={"vllm/core.py": BEFORE}, **asked)
    assert_patch(broken, before={"vllm/core.py": BEFORE}, check_compile=False, reapply=False,
                 **{k: v for k, v in asked.items() if k != "status"})  # asked not to compile: it does not


def test_on_the_pin_a_replacement_that_does_not_compile_fails(sndr_patch_on_pin):
    path = _shipped("PN0007")
    text = open(path, encoding="utf-8").read()
    first = load_patch(path).files[0].edits[0]
    line = first.replacement.rstrip("\n").splitlines()[-1]
    broken = text.replace(line, line.rstrip() + ",,", 1)
    assert broken != text
    with pytest.raises(AssertionError, match="compile_error"):
        sndr_patch_on_pin(broken, verdicts={first.name: "applies"})
