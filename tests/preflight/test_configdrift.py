"""Configuration drift (sndr.preflight.configdrift) on real vLLM trees and on small synthetic ones.

The expected values below were found by hand in the cached trees
(``diff`` of METADATA, of ``vllm/envs.py`` and of ``vllm/engine/arg_utils.py``
plus the ``vllm/config/*.py`` class each EngineArgs default points at).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sndr.errors import EXIT_BAD_INPUT, SndrError
from sndr.model import Patch
from sndr.preflight.configdrift import (
    ConfigDrift,
    WatchConfig,
    compare_config,
    json_schema,
    load_watch_config,
    render_markdown,
    render_terminal,
    runtime_target_drift,
)
from sndr.preflight.configsource import Source, engine_args
from sndr.tree import open_tree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trees(request):
    """version -> opened real tree (cached wheels extracted by sndr.tree.fetch_version)."""
    vllm_root = request.getfixturevalue("vllm_root")
    cache: dict[str, object] = {}

    def get(version: str):
        if version not in cache:
            cache[version] = open_tree(vllm_root(version))
        return cache[version]

    return get


@pytest.fixture(scope="module")
def drift_32_33(trees) -> ConfigDrift:
    return compare_config(trees("0.32.0"), trees("0.33.0"))


def _by_name(items, name):
    hits = [i for i in items if i.name == name]
    assert len(hits) == 1, f"{name}: {hits}"
    return hits[0]


# ----------------------------------------------------------------------------- 0.32.0 -> 0.33.0


def test_torch_pin_change_matches_metadata(trees, drift_32_33):
    # The METADATA itself says so; the report must agree with it.
    assert "Requires-Dist: torch==2.13.0\n" in trees("0.32.0").metadata()
    assert "Requires-Dist: torch==2.14.0\n" in trees("0.33.0").metadata()
    deps = drift_32_33.dependencies
    assert deps.available and deps.source_pin == deps.source_candidate == "wheel METADATA"
    torch = _by_name(deps.changed, "torch")
    assert (torch.old, torch.new, torch.group) == ("==2.13.0", "==2.14.0", None)
    assert torch.detail == "pin 2.13.0 -> 2.14.0"


def test_other_dependency_changes_0320_0330(drift_32_33):
    deps = drift_32_33.dependencies
    fi = _by_name(deps.changed, "flashinfer-python")
    assert (fi.old, fi.new) == ("==0.7.0.post1", "==0.7.2.post1")
    tf = _by_name(deps.changed, "transformers")
    assert (tf.old, tf.new) == ("<5.20.0,>=5.16.1", "<5.21.0,>=5.16.1")
    assert tf.detail == "ceiling 5.20.0 -> 5.21.0"
    assert _by_name(deps.changed, "torchvision").new == "==0.29.0"
    # A dependency that only exists under an extra keeps its group.
    zen = _by_name(deps.changed, "zentorch")
    assert (zen.group, zen.old, zen.new) == ("zen", "==2.13.0.1", "==2.14.0.1")
    # Markers and requested extras are carried, not lost.
    tsm = _by_name(deps.changed, "tokenspeed-mla")
    assert tsm.old_marker == tsm.new_marker == 'platform_system == "Linux"'
    assert _by_name(deps.changed, "humming-kernels").new_extras == ["cu13"]
    assert sorted(c.name for c in deps.added) == ["certifi", "multidict", "orjson"]
    assert _by_name(deps.added, "certifi").new == ">=2026.10.19"
    assert deps.removed == []
    assert len(deps.changed) == 11


def test_env_default_changes_0320_0330(drift_32_33):
    env = drift_32_33.env
    assert env.available
    # AITER FP8/FP4 BMM kernels were flipped from on to off by default (ROCm).
    for name in ("VLLM_ROCM_USE_AITER_FP8BMM", "VLLM_ROCM_USE_AITER_FP4BMM"):
        c = _by_name(env.changed, name)
        assert c.default_changed
        assert (c.old_default, c.new_default) == ("'True'", "'False'")
        assert (c.old_annotated, c.new_annotated) == ("True", "False")
        assert f"os.getenv('{name}', 'False')" in c.new_expr
    assert [c.name for c in env.changed] == ["VLLM_ROCM_USE_AITER_FP4BMM", "VLLM_ROCM_USE_AITER_FP8BMM"]
    fuel = _by_name(env.added, "VLLM_CHAT_TEMPLATE_FUEL")
    assert (fuel.new_default, fuel.new_annotated) == ("'500000'", "500000")
    assert _by_name(env.added, "VLLM_HTTP_MAX_REQUEST_BODY_SIZE").new_default == "str(32 * 1024 * 1024)"
    ray = _by_name(env.removed, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND")
    assert ray.old_default == "'1'"
    assert {c.name for c in env.removed} >= {"VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE", "VLLM_ROCM_MONO_DECODE"}
    assert (len(env.added), len(env.removed)) == (10, 8)


def test_engine_arg_changes_0320_0330(drift_32_33):
    ea = drift_32_33.engine_args
    assert ea.available
    # mamba_cache_mode stopped pointing at CacheConfig (whose default is "none") and became None.
    m = _by_name(ea.changed, "mamba_cache_mode")
    assert (m.old, m.new) == ("'none'", "None")
    assert (m.old_expr, m.new_expr) == ("CacheConfig.mamba_cache_mode", "None")
    assert [c.name for c in ea.changed] == ["mamba_cache_mode"]
    # New arguments, resolved through get_field(...) and ModelConfig.<field>.
    assert _by_name(ea.added, "monokernel").new == "False"
    assert _by_name(ea.added, "monokernel").new_expr == "get_field(KernelConfig, 'monokernel')"
    assert _by_name(ea.added, "sleep_mode_backend").new == "'cumem'"
    assert _by_name(ea.added, "watchdog_config").new == "default_factory=WatchdogConfig"
    assert ea.removed == []


def test_engine_arg_defaults_resolve_through_config_classes(trees):
    args, notes = engine_args(Source(trees("0.33.0")))
    assert args["model"].value == "'Qwen/Qwen3-0.6B'" and args["model"].expr == "ModelConfig.model"
    assert args["max_model_len"].value == "None"  # Field(default=None, ge=-1)
    assert args["seed"].value == "0"
    assert args["kv_cache_dtype"].value == "'auto'"
    # A module constant with arithmetic resolves too (LoadConfig -> DEFAULT_..._BLOCK_SIZE).
    assert args["safetensors_prefetch_block_size"].resolved
    assert not notes


def test_markdown_and_terminal_render_real_drift(drift_32_33):
    md = render_markdown(drift_32_33)
    assert md.startswith("## Configuration drift: 0.32.0 -> 0.33.0")
    assert "| changed | `torch` | `==2.13.0` | `==2.14.0` | pin 2.13.0 -> 2.14.0 |" in md
    assert "`VLLM_ROCM_USE_AITER_FP8BMM` | `'True'` | `'False'` | default |" in md
    assert "| changed | `mamba_cache_mode` | `'none'` | `None` |" in md
    from rich.console import Console

    console = Console(record=True, width=220, color_system=None)
    render_terminal(drift_32_33, console=console)
    text = console.export_text()
    assert "Configuration drift 0.32.0 -> 0.33.0" in text
    assert "==2.14.0" in text and "mamba_cache_mode" in text and "VLLM_ROCM_USE_AITER_FP4BMM" in text


def test_json_round_trip_and_schema(drift_32_33):
    data = json.loads(drift_32_33.model_dump_json())
    assert data["has_attention"] is False
    assert data["dependencies"]["changed"][0]["name"] == "aiohttp"  # unwatched: name order
    again = ConfigDrift.model_validate(data)
    assert again == drift_32_33
    schema = json_schema()
    assert {"dependencies", "env", "engine_args", "runtime_targets", "has_attention"} <= set(schema["properties"])
    assert "DependencyChange" in schema["$defs"]


# ----------------------------------------------------------------------------- watch filter


def test_watch_marks_and_orders(trees):
    watch = WatchConfig(env=["VLLM_ROCM_USE_AITER_FP8*"], engine_args=["--sleep-mode-backend"],
                        dependencies=["Transformers", "nvidia_*"], source="sndr.toml")
    d = compare_config(trees("0.32.0"), trees("0.33.0"), watch)
    # Watched first, then the rest in name order.
    assert [(c.name, c.attention) for c in d.env.changed] == [
        ("VLLM_ROCM_USE_AITER_FP8BMM", True), ("VLLM_ROCM_USE_AITER_FP4BMM", False)]
    names = [(c.name, c.attention) for c in d.dependencies.changed]
    assert names[:2] == [("nvidia-cudnn-frontend", True), ("transformers", True)]
    assert not any(att for _, att in names[2:])
    assert [(c.name, c.attention) for c in d.engine_args.added][0] == ("sleep_mode_backend", True)
    assert d.attention_count == 4 and d.has_attention
    assert d.watch_source == "sndr.toml"
    md = render_markdown(d)
    assert "**4 watched item(s) changed.**" in md
    deps_table = md.split("### Dependencies")[1].split("###")[0]
    rows = [line for line in deps_table.splitlines() if line.startswith("| ") and "`" in line]
    assert rows[0].startswith("| **!** | changed | `nvidia-cudnn-frontend`")
    assert rows[1].startswith("| **!** | changed | `transformers`")
    assert rows[2].startswith("|  |")


def test_watch_with_nothing_changed_has_no_attention(trees):
    d = compare_config(trees("0.32.0"), trees("0.33.0"), WatchConfig(env=["VLLM_HOST_IP"], dependencies=["numpy"]))
    assert not d.has_attention and d.attention_count == 0


# ----------------------------------------------------------------------------- 0.10.0 -> 0.10.1


def test_config_became_a_package_0100_0101(trees):
    old, new = trees("0.10.0"), trees("0.10.1")
    assert old.exists("vllm/config.py") and new.exists("vllm/config/__init__.py")
    d = compare_config(old, new)
    ea = d.engine_args
    assert ea.available
    assert "module vllm/config.py on the pin and a package vllm/config/" in ea.notes[0]
    task = _by_name(ea.changed, "task")
    assert (task.old, task.new) == ("'auto'", "None")
    assert {c.name for c in ea.removed} == {"num_scheduler_steps", "multi_step_stream_outputs"}
    assert _by_name(ea.added, "mm_processor_cache_gb").new == "4"
    env = d.env
    assert (_by_name(env.changed, "VLLM_SKIP_P2P_CHECK").old_default,
            _by_name(env.changed, "VLLM_SKIP_P2P_CHECK").new_default) == ("'0'", "'1'")
    # Only the TYPE_CHECKING annotation moved (8 -> 4); the getenv default was "4" on both.
    gib = _by_name(env.changed, "VLLM_MM_INPUT_CACHE_GIB")
    assert (gib.old_annotated, gib.new_annotated, gib.old_default, gib.new_default) == ("8", "4", "'4'", "'4'")
    assert not gib.default_changed
    assert "`VLLM_MM_INPUT_CACHE_GIB` | `8` | `4` | TYPE_CHECKING default only |" in render_markdown(d)
    target = _by_name(env.changed, "VLLM_TARGET_DEVICE")
    assert not target.default_changed and target.new_expr.endswith(".lower()")
    tf = _by_name(d.dependencies.changed, "transformers")
    assert tf.detail == "floor 4.53.2 -> 4.55.0"
    assert _by_name(d.dependencies.added, "flashinfer-python").group == "flashinfer"


# ----------------------------------------------------------------------------- degraded trees


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_bare_trees_degrade_with_notes(tmp_path):
    base = {"vllm/__init__.py": "", "vllm/version.py": "__version__ = '{v}'\n"}
    old = _write(tmp_path / "a", {**base, "vllm/version.py": "__version__ = '1.0'\n",
                                  "vllm/envs.py": "environment_variables = {'X': lambda: os.getenv('X', '1')}\n"})
    new = _write(tmp_path / "b", {**base, "vllm/version.py": "__version__ = '1.1'\n",
                                  "vllm/envs.py": "environment_variables = {'X': lambda: os.getenv('X', '0')}\n"})
    d = compare_config(open_tree(old), open_tree(new))
    assert (d.pin, d.candidate) == ("1.0", "1.1")
    assert not d.dependencies.available
    assert any("no wheel METADATA and no requirements/*.txt" in n for n in d.dependencies.notes)
    assert not d.engine_args.available
    assert "pin: vllm/engine/arg_utils.py not found" in d.engine_args.notes
    x = _by_name(d.env.changed, "X")
    assert (x.old_default, x.new_default, x.default_changed) == ("'1'", "'0'", True)
    md = render_markdown(d)
    assert "### Dependencies (not available)" in md and "### Engine arguments (not available)" in md


def test_unparsable_envs_degrades(tmp_path):
    old = _write(tmp_path / "a", {"vllm/__init__.py": "", "vllm/version.py": "__version__ = '1.0'\n",
                                  "vllm/envs.py": "environment_variables = {\n"})
    new = _write(tmp_path / "b", {"vllm/__init__.py": "", "vllm/version.py": "__version__ = '1.1'\n",
                                  "vllm/envs.py": "X = 1\n"})
    d = compare_config(open_tree(old), open_tree(new))
    assert not d.env.available
    assert any(n.startswith("pin: vllm/envs.py:1: cannot parse") for n in d.env.notes)
    assert any("no 'environment_variables = {...}' dict literal" in n for n in d.env.notes)


def test_source_tree_requirements(tmp_path):
    common = "# comment\nrequests >= 2.26.0\ntransformers >= 4.50\n"
    old = _write(tmp_path / "a", {"vllm/__init__.py": "", "vllm/version.py": "__version__ = '1.0'\n",
                                  "requirements/common.txt": common,
                                  "requirements/cuda.txt": "-r common.txt\ntorch == 2.7.0\nray[cgraph]>=2.43\n"})
    new = _write(tmp_path / "b", {"vllm/__init__.py": "", "vllm/version.py": "__version__ = '1.1'\n",
                                  "requirements/common.txt": common.replace("4.50", "4.55") + "blake3\n",
                                  "requirements/cuda.txt": "-r common.txt\ntorch == 2.8.0\n"})
    d = compare_config(open_tree(old), open_tree(new))
    deps = d.dependencies
    assert deps.source_pin == "requirements/*.txt"
    torch = _by_name(deps.changed, "torch")
    assert (torch.group, torch.old, torch.new) == ("cuda", "==2.7.0", "==2.8.0")
    assert _by_name(deps.changed, "transformers").detail == "floor 4.50 -> 4.55"
    assert _by_name(deps.added, "blake3").new == ""
    ray = _by_name(deps.removed, "ray")
    assert (ray.group, ray.old_extras) == ("cuda", ["cgraph"])


# ----------------------------------------------------------------------------- watch config files


def test_load_watch_config_found_upward(tmp_path):
    (tmp_path / "sndr.toml").write_text('[watch]\nenv = ["VLLM_ALLREDUCE_USE_FLASHINFER"]\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    # A pyproject without [tool.sndr] on the way up is skipped.
    (tmp_path / "a" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    cfg = load_watch_config(start=deep, stop=tmp_path)
    assert cfg.env == ["VLLM_ALLREDUCE_USE_FLASHINFER"] and cfg.source == str(tmp_path / "sndr.toml")
    assert cfg.watches_env("VLLM_ALLREDUCE_USE_FLASHINFER") and not cfg.watches_env("VLLM_HOST_IP")


def test_load_watch_config_pyproject_and_precedence(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.sndr.watch]\nengine_args = ["--max-num-seqs"]\ndependencies = ["FlashInfer_Python"]\n')
    cfg = load_watch_config(start=tmp_path, stop=tmp_path)
    assert cfg.source == str(tmp_path / "pyproject.toml")
    assert cfg.watches_arg("max_num_seqs") and cfg.watches_dep("flashinfer-python")
    (tmp_path / "sndr.toml").write_text('[watch]\nenv = ["A"]\n')
    assert load_watch_config(start=tmp_path, stop=tmp_path).env == ["A"]


def test_load_watch_config_none_found(tmp_path):
    cfg = load_watch_config(start=tmp_path, stop=tmp_path)
    assert cfg == WatchConfig()


def test_example_config_loads():
    cfg = load_watch_config(REPO / "docs" / "sndr.toml.example")
    assert "VLLM_ALLREDUCE_USE_FLASHINFER" in cfg.env and "torch" in cfg.dependencies
    assert cfg.watches_dep("nvidia-cudnn-frontend")


@pytest.mark.parametrize("name, text, key, code", [
    ("sndr.toml", '[watch]\nenvs = ["X"]\n', "watch.envs", "unknown_key"),
    ("sndr.toml", '[watch]\nenv = "X"\n', "watch.env", "bad_config"),
    ("sndr.toml", '[watch]\nenv = ["X", 3]\n', "watch.env[1]", "bad_config"),
    ("sndr.toml", 'wacth = {}\n', "wacth", "unknown_key"),
    ("sndr.toml", 'watch = 1\n', "watch", "bad_config"),
    ("pyproject.toml", '[tool.sndr.watch]\ndependencies = [""]\n', "tool.sndr.watch.dependencies[0]", "bad_config"),
    ("pyproject.toml", '[tool.sndr.wach]\nenv = []\n', "tool.sndr.wach", "unknown_key"),
])
def test_bad_watch_config_names_file_and_key(tmp_path, name, text, key, code):
    path = tmp_path / name
    path.write_text(text)
    for kwargs in ({"path": path}, {"start": tmp_path, "stop": tmp_path}):
        with pytest.raises(SndrError) as exc:
            load_watch_config(**kwargs)
        p = exc.value.problems[0]
        assert (p.file, p.key, p.code) == (str(path), key, code)
        assert exc.value.exit_code == EXIT_BAD_INPUT
        assert str(path) in exc.value.render() and key in exc.value.render()


def test_bad_toml_names_file_and_line(tmp_path):
    path = tmp_path / "sndr.toml"
    path.write_text('[watch]\nenv = ["X",,]\n')
    with pytest.raises(SndrError) as exc:
        load_watch_config(path)
    p = exc.value.problems[0]
    assert (p.file, p.code, p.line) == (str(path), "bad_toml", 2)


def test_explicit_missing_config(tmp_path):
    with pytest.raises(SndrError) as exc:
        load_watch_config(tmp_path / "nope.toml")
    assert exc.value.problems[0].code == "config_missing"


# ----------------------------------------------------------------------------- runtime targets


def _runtime_patch(pid: str, *targets: tuple[str, str | None]) -> Patch:
    return Patch.model_validate({
        "id": pid, "title": "runtime test", "kind": "runtime",
        "runtime": [{"name": f"e{i}", "target": t, "replacement": "sndr.kernels.fake:impl",
                     **({"signature": sig} if sig else {})} for i, (t, sig) in enumerate(targets)],
    })


def test_runtime_target_drift_0320_0330(trees):
    sched = "vllm.v1.core.sched.scheduler"
    patch = _runtime_patch(
        "PR0001",
        (f"{sched}:Scheduler.schedule", None),
        (f"{sched}:Scheduler._get_local_prefix_cache_hit", None),
        ("vllm.v1.core.sched.async_scheduler:AsyncScheduler.schedule", None),  # inherited
        (f"{sched}:Scheduler.no_such_method", None),
        ("vllm.v1.no_such_module:Thing", None),
        ("torch.nn:Linear.forward", None),
        (f"{sched}:Scheduler.schedule", "(self, scheduler_output)"),
        ("vllm.v1.engine.core:EngineCore.profile", None),
    )
    res = runtime_target_drift([patch], trees("0.32.0"), trees("0.33.0"))
    status = [r.status for r in res]
    assert status == ["ok", "signature_changed", "ok", "missing", "module_missing", "unchecked",
                      "signature_changed", "signature_changed"]
    sch = res[0]
    assert sch.kind == "method" and sch.candidate_signature == "(self, throttle_prefills: bool=False) -> SchedulerOutput"
    assert sch.candidate_location == "vllm/v1/core/sched/scheduler.py:699"
    hit = res[1]
    assert hit.note == "parameters changed"
    assert hit.pin_signature == "(self, request: Request) -> tuple[KVCacheBlocks, int, int, bool]"
    assert "max_cache_hit_length: int | None=None" in hit.candidate_signature
    assert res[2].candidate_location.startswith("vllm/v1/core/sched/scheduler.py:")
    assert "Scheduler.no_such_method not found in vllm.v1.core.sched.scheduler" in res[3].note
    assert res[6].note == ("binding check: signature of vllm.v1.core.sched.scheduler:Scheduler.schedule is "
                           "(self, throttle_prefills=), the patch declares (self, scheduler_output)")
    assert "profiler_kwargs" in res[7].candidate_signature
    # Attached to the drift report, broken targets render first.
    d = compare_config(trees("0.32.0"), trees("0.33.0"), patches=[patch])
    assert [r.status for r in d.runtime_targets] == status
    assert len(d.runtime_broken) == 5
    md = render_markdown(d)
    table = md.split("### Runtime-patch targets")[1]
    first = [line for line in table.splitlines() if line.startswith("| PR0001")][0]
    assert "**signature_changed**" in first
