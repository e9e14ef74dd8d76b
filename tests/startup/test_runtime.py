"""Runtime patches: binding check, deferral, idempotence, revert, chains, conflicts, security."""

from __future__ import annotations

import hashlib
import sys
import textwrap
import uuid

import pytest

from sndr.startup import importer
from sndr.startup.runtime import RuntimePatcher, StrictError, call_counter, static_binding

TARGET = '''\
class Base:
    def greet(self, name):
        return "hello " + name


class Engine(Base):
    def step(self, n, *, scale=1):
        return (n + 1) * scale

    @classmethod
    def build(cls, size):
        return ("built", size)

    @staticmethod
    def helper(x):
        return x * 2


def answer():
    return 41
'''

REPL = '''\
def fixed_answer():
    return 42


def double_step(original):
    def step(self, n, *, scale=1):
        return original(self, n, scale=scale) * 2
    return step


def plus_one_step(original):
    def step(self, n, *, scale=1):
        return original(self, n, scale=scale) + 1
    return step


def shout(self, name):
    return "HELLO " + name.upper()
'''


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    name = "rt_" + uuid.uuid4().hex[:8]
    d = tmp_path / name
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "target.py").write_text(TARGET)
    (d / "repl.py").write_text(REPL)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[m]
    importer.uninstall()


def spec(pkg, name, target, replacement, **kw):
    s = {"patch": kw.pop("patch", "P1"), "name": name, "target": f"{pkg}.{target}",
         "replacement": replacement if ":" in replacement and replacement.startswith("sndr") else f"{pkg}.{replacement}",
         "required": True, "signature": None, "source_sha256": None, "chain": False, "wrap": False,
         "allowed": ["sndr", pkg]}
    s.update(kw)
    return s


def test_replace_an_imported_function_and_revert(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    original = mod.answer
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "fix", "target:answer", "repl:fixed_answer", signature="()")])
    assert o.verdict == "applied"
    assert mod.answer() == 42 and mod.answer.__sndr_patch__ == "P1/fix"
    p.apply([spec(pkg, "fix", "target:answer", "repl:fixed_answer")])  # idempotent
    assert p.counts() == {"applied": 1}
    assert p.revert() == []
    assert mod.answer is original


def test_wrap_a_method_keeps_it_idempotent(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    s = spec(pkg, "count", "target:Engine.step", "sndr.startup.runtime:call_counter", wrap=True, signature="(self, n, *, scale=)")
    p.apply([s])
    p.apply([s])
    RuntimePatcher().apply([s])  # a second patcher sees the mark and does not wrap twice
    e = mod.Engine()
    assert e.step(1, scale=3) == 6
    assert mod.Engine.step.sndr_calls == 1


def test_deferred_until_import_and_visible_to_from_imports(pkg):
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "fix", "target:answer", "repl:fixed_answer", signature="()")])
    assert o.verdict == "pending" and f"{pkg}.target" not in sys.modules
    ns = {}
    exec(f"from {pkg}.target import answer", ns)
    assert ns["answer"]() == 42
    assert p.outcomes["P1/fix"].verdict == "applied"


def test_signature_mismatch_is_drifted_and_touches_nothing(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    original = mod.Engine.step
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "c", "target:Engine.step", "sndr.startup.runtime:call_counter", wrap=True,
                        signature="(self, n, extra)")])
    assert o.verdict == "drifted"
    assert "signature of" in o.reason and "(self, n, *, scale=)" in o.reason
    assert mod.Engine.step is original
    assert p.missing_required() == [o]


def test_deferred_static_check_is_loud_at_startup(pkg, capsys):
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "loud", "target:Engine.step", "sndr.startup.runtime:call_counter", wrap=True,
                        signature="(self)", patch="LOUD")])
    # The module is not imported (its package is not either): the check read the file statically.
    assert o.verdict == "drifted"
    assert "runtime patch LOUD/loud" in capsys.readouterr().err


def test_strict_raises_with_the_reason(pkg):
    import importlib

    importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher(strict=True)
    with pytest.raises(StrictError, match="SNDR_STRICT=1.*|signature"):
        p.apply([spec(pkg, "c", "target:Engine.step", "sndr.startup.runtime:call_counter", wrap=True, signature="(self)")])


def test_missing_target_is_drifted(pkg):
    p = RuntimePatcher(strict=False)
    s = spec(pkg, "gone", "target:Engine.vanished", "sndr.startup.runtime:call_counter", wrap=True)
    [o] = p.apply([s])
    assert o.verdict == "drifted" and "not found" in o.reason  # static check, module not imported


def test_strict_failure_at_import_time_fails_the_import(pkg, monkeypatch):
    """A deferred edit whose live check fails under strict makes the import itself fail, with sndr's message."""
    import importlib

    p = RuntimePatcher(strict=True)
    [o] = p.apply([spec(pkg, "late", "target:answer", "repl:missing_function")])
    assert o.verdict == "pending"
    with pytest.raises(StrictError, match="late"):
        importlib.import_module(f"{pkg}.target")
    assert f"{pkg}.target" not in sys.modules


def test_source_hash_binding(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    seg = 'def answer():\n    return 41'
    good = hashlib.sha256(seg.encode()).hexdigest()
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "a", "target:answer", "repl:fixed_answer", source_sha256=good)])
    assert o.verdict == "applied" and mod.answer() == 42
    p.revert()
    [o] = RuntimePatcher().apply([spec(pkg, "b", "target:answer", "repl:fixed_answer", source_sha256="0" * 64)])
    assert o.verdict == "drifted" and "source of" in o.reason


def test_replacement_outside_sndr_and_the_pack_is_refused(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    [o] = p.apply([spec(pkg, "evil", "target:answer", "os:getcwd", allowed=["sndr"])])
    assert o.verdict == "refused" and "outside sndr" in o.reason
    [o] = p.apply([spec(pkg, "evil2", "target:answer", "repl:fixed_answer", allowed=["sndr"])])
    assert o.verdict == "refused"
    assert mod.answer() == 41
    # A prefix is a package boundary, not a string prefix.
    from sndr.packs import module_allowed

    assert not module_allowed("sndr_evil.x") and module_allowed("sndr.kernels.x") and module_allowed("acme.x", "acme")


def test_two_edits_on_one_target_conflict_unless_chained(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    a = spec(pkg, "a", "target:Engine.step", "repl:double_step", wrap=True, patch="P1")
    b = spec(pkg, "b", "target:Engine.step", "repl:plus_one_step", wrap=True, patch="P2")
    outs = p.apply([a, b])
    assert [o.verdict for o in outs] == ["ambiguous", "ambiguous"]
    assert mod.Engine().step(1) == 2  # untouched
    b["chain"] = True
    outs = RuntimePatcher().apply([a, b])
    assert [o.verdict for o in outs] == ["applied", "applied"]
    assert mod.Engine().step(1) == (2 * 2) + 1


def test_conflict_with_an_edit_installed_earlier(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    p.apply([spec(pkg, "a", "target:Engine.step", "repl:double_step", wrap=True, patch="P1")])
    [o] = RuntimePatcher().apply([spec(pkg, "b", "target:Engine.step", "repl:plus_one_step", wrap=True, patch="P2")])
    assert o.verdict == "ambiguous" and "already replaced by P1/a" in o.reason
    assert mod.Engine().step(1) == 4


def test_revert_restores_descriptors_and_inherited_attributes(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    outs = p.apply([
        spec(pkg, "cm", "target:Engine.build", "sndr.startup.runtime:call_counter", wrap=True, signature="(cls, size)"),
        spec(pkg, "sm", "target:Engine.helper", "sndr.startup.runtime:call_counter", wrap=True, signature="(x)"),
        spec(pkg, "inh", "target:Engine.greet", "repl:shout", signature="(self, name)"),
    ])
    # greet is inherited from Base: the binding follows the base class, and the
    # patch shadows it on Engine only.
    assert [o.verdict for o in outs] == ["applied", "applied", "applied"]
    assert "greet" in mod.Engine.__dict__
    assert mod.Engine.build(3) == ("built", 3) and mod.Engine.helper(2) == 4
    assert isinstance(mod.Engine.__dict__["build"], classmethod)
    assert isinstance(mod.Engine.__dict__["helper"], staticmethod)
    assert p.revert() == []
    assert mod.Engine.build.__func__.__name__ == "build" and not hasattr(mod.Engine.__dict__["build"], "__sndr_patch__")
    assert "greet" not in mod.Engine.__dict__  # the inherited attribute is visible again


def test_revert_refuses_an_attribute_replaced_by_someone_else(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    p = RuntimePatcher()
    p.apply([spec(pkg, "fix", "target:answer", "repl:fixed_answer")])

    def other():
        return 7

    mod.answer = other
    problems = p.revert()
    assert problems and "replaced by someone else" in problems[0]
    assert mod.answer is other


def test_live_signature_check_catches_a_foreign_replacement(pkg):
    import importlib

    mod = importlib.import_module(f"{pkg}.target")
    mod.Engine.step = lambda self, n, extra: n  # another plugin got there first; the file still says otherwise
    [o] = RuntimePatcher().apply([spec(pkg, "c", "target:Engine.step", "sndr.startup.runtime:call_counter", wrap=True,
                                       signature="(self, n, *, scale=)")])
    assert o.verdict == "drifted" and "live signature" in o.reason


def test_runtime_and_preflight_verdicts_agree(tmp_path):
    """The planner (preflight/apply) and the runtime check share check_binding: same verdict, same reason."""
    from sndr.load import PatchSet, parse_patch
    from sndr.plan import build_plan

    text = TARGET
    patch = parse_patch(textwrap.dedent('''
        id = "R1"
        title = "t"
        kind = "runtime"
        [[runtime]]
        name = "c"
        target = "vllm.x:Engine.step"
        replacement = "sndr.startup.runtime:call_counter"
        wrap = true
        signature = "(self, n)"
    '''), "R1.toml")
    plan = build_plan(PatchSet([patch]), lambda rel: text if rel == "vllm/x.py" else None, "0.32.0")
    [edit] = plan.patches[0].edits
    s = dict(patch.runtime[0].model_dump(mode="json"), patch="R1")
    verdict, reason = static_binding(s, text, "vllm.x")
    assert (edit.verdict.value, edit.reason) == (verdict, reason) == ("drifted", reason)
    assert "the patch declares (self, n)" in reason


def test_call_counter_keeps_name_and_signature():
    import inspect

    def f(a, b=2):
        return a + b

    w = call_counter(f)
    assert w(1) == 3 and w.sndr_calls == 1 and w.__name__ == "f"
    assert str(inspect.signature(w)) == "(a, b=2)"
