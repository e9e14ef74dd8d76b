"""Issue 16: a 47-patch stack on real vLLM 0.32.0 files, through the real apply/verify/revert path.

Sections: (1) ``after`` orders and never gates; (2) stacked edits are not conflicts;
(3) a conflict is not drift; (4) per-patch failure policy; (5) honest statuses;
(6) ``when`` predicates and deployment profiles. The stack is built by ``stackgen``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sndr import env as sndr_env
from sndr.apply import run_apply, run_revert, run_verify
from sndr.errors import SndrError
from sndr.load import load_patch_set
from sndr.model import Ledger, Verdict
from sndr.plan import build_plan, enabled_set
from sndr.profile import load_profile, parse_profile
from tests.conftest import copy_tree
from tests.stack.stackgen import BLOCK_POOL, PROFILE, stack_paths, write_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, vllm_pin_root):
    d = tmp_path_factory.mktemp("stack")
    ids = write_stack(vllm_pin_root, d / "patches")
    (d / "prod.toml").write_text(PROFILE)
    return d, ids


@pytest.fixture
def tree(tmp_path, vllm_pin_root):
    return copy_tree(vllm_pin_root, tmp_path / "site", stack_paths(vllm_pin_root))


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".sndr" not in p.parts}


def _env(**enable) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNDR_ENABLE_") and k != "SNDR_PROFILE"}
    env.update({f"SNDR_ENABLE_{k}": "1" for k in enable})
    return env


def _status(report) -> dict[str, str]:
    return {p.id: p.status for p in report.patches}


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sndr.apply", *args], capture_output=True, text=True, cwd=REPO,
                          env=env if env is not None else _env(), timeout=300)


# ----------------------------------------------------------------------------- the whole stack


def test_stack_applies_verifies_reverts_byte_exact(stack, tree):
    d, ids = stack
    assert len(ids) >= 40
    ps = load_patch_set(d / "patches", packs=False)
    prof = load_profile(d / "prod.toml")
    before = _hashes(tree)
    r = run_apply(tree, ps, environ=_env(), profile=prof)
    assert r.exit_code == 0, [p.render() for p in r.problems]
    st = _status(r)
    assert st["HA1"] == st["HA4"] == st["HB2"] == st["CC1"] == "applies"
    assert st["W5"] == "gated" and st["N1"] == "nothing_to_do"
    # Hot spot A: fixed order by `after`, HA6 at the edge of HA1's anchor, HA3 rewrote HA2's line.
    bp = (tree / BLOCK_POOL).read_text()
    i = bp.index("        # HA6: before popleft_n\n        ret: list[KVCacheBlock] = self.free_block_queue.popleft_n("
                 "num_blocks)\n        # HA1: popped from the free queue\n        # HA2: stacked on HA1 (amended by HA3)\n"
                 "        # HA4: last\n")
    assert i > 0 and "# HA2: stacked on HA1\n" not in bp
    assert "block.ref_cnt -= 1  # HB1\n            if block.ref_cnt == 0 and not block.is_null:\n" \
           "                # HB2: context HB1 re-emits\n" in bp
    # Verify: ledger by hash; a second apply writes nothing; revert is byte-exact.
    assert run_verify(tree, ps, environ=_env(), profile=prof).exit_code == 0
    again = run_apply(tree, ps, environ=_env(), profile=prof)
    assert again.exit_code == 0 and again.files_written == []
    ledger = Ledger.model_validate_json((tree / ".sndr" / "ledger.json").read_text())
    assert ledger.patches.index("HA1") < ledger.patches.index("HA2") < ledger.patches.index("HA3") \
        < ledger.patches.index("HA4")
    assert ledger.results["N1"] == "nothing_to_do"
    assert run_revert(tree).exit_code == 0
    assert _hashes(tree) == before


def test_stack_is_recognised_after_a_changed_set_replans_from_pristine(stack, tree):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    prof = load_profile(d / "prod.toml")
    before = _hashes(tree)
    assert run_apply(tree, ps, environ=_env(), profile=prof).exit_code == 0
    # Another set (P23 on): re-planned from the stored pristine copies, not from the patched files.
    r = run_apply(tree, ps, environ=_env(**{"P23_WIRE_1": 1}), profile=prof)
    assert r.exit_code == 0 and _status(r)["HA4"] == "applies" and _status(r)["P23_WIRE-1"] == "applies"
    assert run_verify(tree, ps, environ=_env(**{"P23_WIRE_1": 1}), profile=prof).exit_code == 0
    assert run_revert(tree).exit_code == 0 and _hashes(tree) == before


# ----------------------------------------------------------------------------- 1. after


def test_after_orders_but_never_gates(stack):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    es = enabled_set(ps, "0.32.0", {"SNDR_ENABLE_HA1": "0"})
    order, gates = [p.id for p in es.ordered], es.gates
    assert order.index("HA1") < order.index("HA2") < order.index("HA3") < order.index("HA4")
    assert not gates["HA1"].enabled and gates["HA2"].enabled and gates["HA4"].enabled  # after never gates
    gates = enabled_set(ps, "0.32.0", {"SNDR_ENABLE_K2": "1"}).gates
    assert gates["K2"].code == "requires_gated"  # requires does


@pytest.mark.parametrize("top, code, key", [
    ('after = ["NOPE"]', "unknown_id", "after"),
    ('after = ["B2"]', "requires_cycle", "after"),
])
def test_after_is_validated_with_file_and_line(tmp_path, top, code, key):
    a = f'id = "A1"\ntitle = "a"\n{top}\n[[files]]\npath = "vllm/x.py"\n[[files.edits]]\nname = "e"\nanchor = "x"\nreplacement = "y"\n'
    b = 'id = "B2"\ntitle = "b"\n\nafter = ["A1"]\n[[files]]\npath = "vllm/x.py"\n[[files.edits]]\nname = "e"\nanchor = "z"\nreplacement = "w"\n'
    (tmp_path / "A1.toml").write_text(a)
    (tmp_path / "B2.toml").write_text(b)
    with pytest.raises(SndrError) as info:
        load_patch_set(tmp_path, packs=False)
    probs = [p for p in info.value.problems if p.code == code]
    assert probs and probs[0].key == key and probs[0].file.endswith(".toml") and probs[0].line in (3, 4)


# ----------------------------------------------------------------------------- 2/3. stacked edits, conflicts


@pytest.mark.parametrize("enable, other, suggest", [
    ("HB3", "HB1", None),          # true same-byte conflict: no order works
    ("CC2", "CC1", 'add after = ["CC2"] to CC1'),  # the other order works: say so
    ("CC4", "CC1", 'declare after = ["CC1"] in CC4'),  # rewrites CC1's bytes, unordered
])
def test_conflict_is_its_own_verdict_and_exit_1(stack, vllm_pin_root, enable, other, suggest):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    plan = build_plan(ps, lambda rel: (vllm_pin_root / rel).read_text() if (vllm_pin_root / rel).exists() else None,
                      "0.32.0", environ=_env(**{enable: 1}), profile=load_profile(d / "prod.toml"),
                      check_compile=False)
    res = {p.id: p for p in plan.patches}[enable]
    e = res.edits[0]
    assert e.verdict == Verdict.CONFLICT and res.status == "failed"
    assert e.conflict_with == [other] and other in e.reason and "pristine lines" in e.reason
    assert e.reason.count("lines") == 2  # both line spans
    if suggest:
        assert suggest in e.hint
    else:
        assert "either order" in e.hint
    codes = {p.code for p in plan.problems}
    assert codes <= {"conflict", "overlap_conflict"}


def test_overlap_exits_1_not_2_through_the_cli(stack, tree):
    d, _ = stack
    r = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--profile", str(d / "prod.toml"), "--dry-run",
             "--json", "-", env=_env(HB3=1))
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert [p["code"] for p in doc["problems"]] == ["conflict"]


# ----------------------------------------------------------------------------- 4. failure policy


def test_skip_leaves_out_whole_with_dependents_and_records_it(stack, tree):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    prof = load_profile(d / "prod.toml")
    before = _hashes(tree)
    # K2 (on_failure = fail) requires K1 (skip, drifted): without --keep-going the set is refused.
    r = run_apply(tree, ps, environ=_env(K1=1, K2=1), profile=prof)
    assert r.exit_code == 1 and "requires_left_out" in {p.code for p in r.problems} and _hashes(tree) == before
    r = run_apply(tree, ps, environ=_env(K1=1, K2=1), profile=prof, keep_going=True)
    assert r.exit_code == 1 and not r.ok and r.files_written
    lo = {x.id: x for x in r.left_out}
    assert lo["K1"].by == "on_failure" and lo["K2"].by == "requires" and "K1" in lo["K2"].reason
    assert _status(r)["K1"] == _status(r)["K2"] == "left_out" and _status(r)["HA4"] == "applies"
    ledger = Ledger.model_validate_json((tree / ".sndr" / "ledger.json").read_text())
    assert set(ledger.left_out) == {"K1", "K2"} and "K1" not in ledger.patches
    v = run_verify(tree, ps, environ=_env(K1=1, K2=1), profile=prof)
    # K2 (on_failure = fail) left out by --keep-going is a finding; K1 (skip) is listed, as its policy allows.
    assert v.exit_code == 1 and {p.patch for p in v.problems if p.code == "left_out"} == {"K2"}
    assert [(p.id, p.status) for p in v.patches if p.id in lo] == [("K1", "left_out"), ("K2", "left_out")]
    assert any(n.startswith("skipped 1 patch(es) whole") and "K1 (edit_drifted, on_failure: " in n for n in v.notes)
    # Re-running without --keep-going is refused again (never the fast path over a left-out set).
    assert run_apply(tree, ps, environ=_env(K1=1, K2=1), profile=prof).exit_code == 1
    assert run_revert(tree).exit_code == 0 and _hashes(tree) == before


def test_a_skip_patch_left_out_is_a_warning_and_the_run_is_green(stack, tree):
    """Issue 31 defect 3: a patch whose own on_failure = "skip" allows its absence is listed, recorded, exit 0;
    defect 4: verify lists each patch once."""
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    prof = load_profile(d / "prod.toml")
    r = run_apply(tree, ps, environ=_env(K1=1), profile=prof)
    assert r.exit_code == 0 and r.ok and r.files_written, [p.render() for p in r.problems]
    assert [(x.id, x.by, x.code) for x in r.left_out] == [("K1", "on_failure", "edit_drifted")]
    assert _status(r)["K1"] == "left_out"
    assert any(n.startswith('skipped 1 patch(es) whole, as their on_failure = "skip" allows: K1 (edit_drifted, on_failure: ')
               for n in r.notes)
    ledger = Ledger.model_validate_json((tree / ".sndr" / "ledger.json").read_text())
    assert set(ledger.left_out) == {"K1"} and ledger.left_out["K1"].allowed
    v = run_verify(tree, ps, environ=_env(K1=1), profile=prof)
    assert v.exit_code == 0 and not v.problems and _status(v)["K1"] == "left_out"
    assert any("K1 (edit_drifted, on_failure: " in n for n in v.notes)
    for extra in ([], ["-v"]):
        c = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--profile", str(d / "prod.toml"), "--verify",
                 "--json", "-", *extra, env=_env(K1=1))
        assert c.returncode == 0, c.stderr
        ids = [p["id"] for p in json.loads(c.stdout)["patches"]]
        assert len(ids) == len(set(ids)) and "K1" in ids
    # --keep-going over a fail patch is still a finding, and verify still lists each patch once.
    r = run_apply(tree, ps, environ=_env(K1=1, K3=1), profile=prof, keep_going=True)
    assert r.exit_code == 1 and {x.id: x.allowed for x in r.left_out} == {"K1": True, "K3": False}
    c = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--profile", str(d / "prod.toml"), "--verify",
             "--json", "-", env=_env(K1=1, K3=1))
    assert c.returncode == 1
    doc = json.loads(c.stdout)
    ids = [p["id"] for p in doc["patches"]]
    assert len(ids) == len(set(ids)) and [p["patch"] for p in doc["problems"] if p["code"] == "left_out"] == ["K3"]


def test_keep_going_cli_lists_what_was_left_out(stack, tree):
    d, _ = stack
    r = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--profile", str(d / "prod.toml"),
             "--keep-going", "--json", str(tree / "r.json"), env=_env(K3=1))
    assert r.returncode == 1, r.stderr
    doc = json.loads((tree / "r.json").read_text())
    assert [x["id"] for x in doc["left_out"]] == ["K3"] and doc["left_out"][0]["by"] == "keep_going"
    assert "left out 1 patch(es) whole: K3" in r.stdout


def test_hook_attests_left_out_and_strict_refuses_a_required_one(stack, tree):
    """The startup hook's disk check: on_failure = fail left out by --keep-going is a missing required patch."""
    from sndr.startup import hook, resolve

    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    prof = load_profile(d / "prod.toml")
    env = _env(K1=1, K3=1)
    assert run_apply(tree, ps, environ=env, profile=prof, keep_going=True).exit_code == 1
    ledger = json.loads((tree / ".sndr" / "ledger.json").read_text())
    from sndr.profile import use_process_profile

    use_process_profile(prof)
    try:
        resolved = resolve.build_resolved(ps, "0.32.0", env)
    finally:
        use_process_profile(None)
    state = hook._Process(strict=True)
    hook._check_disk(state, str(tree), ledger, resolved)
    assert any(m.startswith("K3: left out at apply (keep_going)") for m in state.missing)
    assert not any(m.startswith("K1") for m in state.missing)  # on_failure = skip: absent by policy
    assert any(p.startswith("K1: left out at apply (on_failure)") for p in state.problems)
    assert resolved["gate_reasons"]["W5"].startswith("when_mismatch")


# ----------------------------------------------------------------------------- 5. honest statuses


def test_nothing_to_do_and_env_var_hint_and_only_summary(stack, tree):
    d, _ = stack
    r = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--profile", str(d / "prod.toml"), "--dry-run",
             "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    n1 = next(p for p in doc["patches"] if p["id"] == "N1")
    assert n1["status"] == "nothing_to_do"
    p23 = next(p for p in doc["patches"] if p["id"] == "P23_WIRE-1")
    assert "SNDR_ENABLE_P23_WIRE_1=1" in p23["reason"]
    assert "N1         nothing_to_do" in r.stderr  # the terminal report (stderr when JSON goes to stdout)
    # --only: one summary line instead of a gated row per other patch.
    r = _cli("--tree", str(tree), "--patches", str(d / "patches"), "--dry-run", "--only", "HA1", "HA2", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["id"] for p in doc["patches"]] == ["HA1", "HA2"]
    assert any(n.startswith("--only: 45 other patch(es) not selected") for n in doc["notes"])
    assert "gated" not in doc["counts"]


def test_manifest_out_file_or_directory(stack, tmp_path):
    d, _ = stack
    env = _env()

    def build(out: Path):
        return subprocess.run([sys.executable, "-m", "sndr", "manifest", "build", "--tree", "vllm==0.32.0",
                               "--patches", str(d / "patches"), "--out", str(out)], capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=300)

    r = build(tmp_path / "m.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["vllm_version"] == "0.32.0"
    r = build(tmp_path / "m.txt")
    assert r.returncode == 2 and "wants a directory" in r.stderr and not (tmp_path / "m.txt").exists()
    r = build(tmp_path / "anchors")
    assert r.returncode == 0 and (tmp_path / "anchors" / "vllm-0.32.0.json").is_file()


# ----------------------------------------------------------------------------- 6. when


def test_when_without_profile_is_gated_unknown_never_guessed(stack):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    gates = enabled_set(ps, "0.32.0", _env()).gates
    for pid in ("W1", "W2", "W3", "W4", "W5", "W6"):
        assert gates[pid].code == "when_unknown" and "no deployment profile" in gates[pid].reason
    prof = parse_profile('gpu_capability = "8.6"\nkv_cache_dtype = "auto"\n', "partial.toml")
    gates = enabled_set(ps, "0.32.0", _env(), profile=prof).gates
    assert gates["W1"].code == "when_mismatch" and gates["W2"].code == "when_mismatch"
    assert gates["W3"].code == "when_unknown" and "partial.toml does not set it" in gates["W3"].reason


def test_profile_from_environ_matches_explicit(stack):
    d, _ = stack
    ps = load_patch_set(d / "patches", packs=False)
    explicit = enabled_set(ps, "0.32.0", _env(), profile=load_profile(d / "prod.toml"))
    via_env = enabled_set(ps, "0.32.0", dict(_env(), SNDR_PROFILE=str(d / "prod.toml")))
    assert explicit.gates == via_env.gates and explicit.digest == via_env.digest
    explicit = explicit.gates
    assert [i for i, g in explicit.items() if g.enabled and i.startswith("W")] == ["W1", "W2", "W3", "W4", "W6"]


def test_list_profile_shows_what_a_profile_gets(stack):
    d, _ = stack
    r = subprocess.run([sys.executable, "-m", "sndr", "list", "--patches", str(d / "patches"), "--profile",
                        str(d / "prod.toml"), "--json", "-"], capture_output=True, text=True, cwd=REPO, env=_env(),
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)["patches"]}
    assert rows["W1"]["verdict"] == "enabled" and rows["W1"]["when"] == {"kv_cache_dtype": "fp8*"}
    assert rows["W5"]["verdict"] == "gated" and rows["W5"]["reason"].startswith("when_mismatch")
    assert rows["HB3"]["verdict"] == "gated" and "SNDR_ENABLE_HB3" in rows["HB3"]["reason"]


@pytest.mark.parametrize("text, line, needle", [
    ('model_arch = "X"\ngpu = "9.0"\n', 2, "unknown key 'gpu'"),
    ('gpu_capability = "nine"\n', 1, "not major.minor"),
    ('kv_cache_dtype = 8\n', 1, "non-empty string"),
])
def test_bad_profile_names_file_line_and_key(tmp_path, text, line, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(SndrError) as info:
        load_profile(p)
    (prob,) = info.value.problems
    assert prob.code == "bad_profile" and prob.line == line and needle in prob.message and prob.file == str(p)


def test_bad_when_is_a_patch_error(tmp_path):
    (tmp_path / "A.toml").write_text('id = "A"\ntitle = "a"\nwhen = { gpu_capability = "sm90" }\n'
                                     '[[files]]\npath = "vllm/x.py"\n[[files.edits]]\nname = "e"\nanchor = "x"\n'
                                     'replacement = "y"\n')
    with pytest.raises(SndrError) as info:
        load_patch_set(tmp_path, packs=False)
    (prob,) = info.value.problems
    assert prob.code == "bad_patch" and prob.key == "when" and prob.line == 3 and "sm90" in prob.message


def test_process_profile_reads_only_what_the_process_knows(tmp_path, monkeypatch):
    """No torch imported here: platform/gpu_capability are unknown with the reason; the declared profile fills in."""
    from sndr import profile as pm

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    (tmp_path / "p.toml").write_text('platform = "cuda"\n')
    prof = pm.process_profile({"SNDR_PROFILE": str(tmp_path / "p.toml")}, argv=["vllm", "serve", "m"])
    assert prof.get("platform") == ("cuda", f"profile {tmp_path / 'p.toml'}")
    value, why = prof.get("gpu_capability")
    assert value is None and "torch is not imported" in why
    value, why = prof.get("kv_cache_dtype")  # vLLM is not installed in this interpreter: never guessed
    assert value is None and "vLLM is not installed" in why
    ok, code, reason = pm.evaluate({"kv_cache_dtype": "fp8*"}, prof)
    assert (ok, code) == (False, "when_unknown") and "vLLM is not installed" in reason


@pytest.mark.skipif(not Path(sndr_env.vllm_test_python()).exists(),
                    reason=f"no_vllm_install: no CPU vLLM 0.32.0 venv at {sndr_env.vllm_test_python()} "
                           f"(set {sndr_env.TEST_VLLM_PYTHON}); build it with: {sndr_env.TEST_VLLM_BUILD}")
@pytest.mark.slow
def test_process_profile_parses_argv_with_vllms_own_parser(tmp_path):
    """In the real vLLM 0.32.0 venv: the engine arguments come from vLLM's parser (or its failure is the reason)."""
    py = sndr_env.vllm_test_python()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3NextForCausalLM"]}))
    code = ("import json,sys; sys.path.insert(0, sys.argv[1]); from sndr import profile as pm; "
            "p = pm.process_profile({}, argv=['vllm', 'serve', sys.argv[2], '--kv-cache-dtype', 'fp8', "
            "'--speculative-config', '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}']); "
            "print(json.dumps({k: p.get(k) for k in ('kv_cache_dtype', 'spec_method', 'model_arch', 'quantization')}))")
    r = subprocess.run([str(py), "-c", code, str(REPO), str(model)], capture_output=True, text=True, timeout=600,
                       env={"PATH": os.environ.get("PATH", ""), "HOME": str(Path.home())})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if got["kv_cache_dtype"][0] is None:  # vLLM's parser could not be built on this CPU-only host: said so
        assert "vLLM's argument parser could not be built" in got["kv_cache_dtype"][1]
    else:
        assert got["kv_cache_dtype"][0] == "fp8" and got["spec_method"][0] == "mtp"
        assert got["model_arch"][0] == "Qwen3NextForCausalLM" and got["quantization"][0] == "none"
