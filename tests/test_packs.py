"""Plugin packs (entry point group ``sndr.patches``): discovery, namespacing, gating, code boundaries."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid

import pytest

from sndr import packs
from sndr.errors import SndrError
from sndr.load import load_patch_set

PACK_INIT = '''\
from pathlib import Path
import pluggy

hookimpl = pluggy.HookimplMarker("sndr")


@hookimpl
def sndr_patch_dirs():
    return [Path(__file__).parent / "patches"]


def fixed_answer():
    return 42
'''

BUILTIN = '''\
id = "B0001"
title = "A built-in"

[[files]]
path = "vllm/engine.py"

[[files.edits]]
name = "e"
anchor = "return 41"
replacement = "return 42"
'''


def pack_patch(pid: str, **over) -> str:
    body = {
        "title": '"Pack patch"',
        "kind": '"runtime"',
        "default": "true",
    }
    body.update(over.pop("top", {}))
    lines = [f'id = "{pid}"'] + [f"{k} = {v}" for k, v in body.items()]
    repl = over.pop("replacement", "{module}:fixed_answer")
    lines += ["", "[[runtime]]", 'name = "r"', 'target = "vllm.engine:answer"', f'replacement = "{repl}"']
    return "\n".join(lines) + "\n"


@pytest.fixture
def make_pack(tmp_path, monkeypatch):
    made = []

    def make(ep_name: str, patches: dict[str, str]) -> str:
        module = f"pack_{uuid.uuid4().hex[:8]}"
        site = tmp_path / f"site_{module}"
        (site / module / "patches").mkdir(parents=True)
        (site / module / "__init__.py").write_text(PACK_INIT)
        for name, text in patches.items():
            (site / module / "patches" / name).write_text(text.replace("{module}", module))
        info = site / f"{module}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[sndr.patches]\n{ep_name} = {module}\n")
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        packs.refresh()
        made.append(module)
        return module

    yield make
    packs.refresh()
    for m in made:
        sys.modules.pop(m, None)


@pytest.fixture
def builtins(tmp_path):
    d = tmp_path / "builtin"
    d.mkdir()
    (d / "B0001-e.toml").write_text(BUILTIN)
    return d


def test_pack_patches_load_with_built_ins(make_pack, builtins):
    module = make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001")})
    ps = load_patch_set(builtins)
    assert [p.id for p in ps.patches] == ["B0001", "ACME_0001"]
    assert ps.source_of("ACME_0001").endswith(f"{module}/patches/ACME_0001-r.toml")
    [pack] = packs.discover()
    assert (pack.name, pack.module, pack.version, pack.prefix) == ("acme", module, "1.0", "ACME_")
    assert packs.pack_of_source(ps.source_of("ACME_0001")) == pack
    assert packs.pack_of_source(ps.source_of("B0001")) is None


def test_ids_must_be_namespaced(make_pack, builtins):
    make_pack("acme", {"PN0001-r.toml": pack_patch("PN0001")})
    with pytest.raises(SndrError) as exc:
        load_patch_set(builtins)
    [problem] = exc.value.problems
    assert problem.code == "pack_id_namespace" and "ACME_" in problem.hint and problem.file.endswith("PN0001-r.toml")


def test_a_pack_cannot_shadow_a_built_in(make_pack, tmp_path):
    d = tmp_path / "b2"
    d.mkdir()
    (d / "ACME_0001-x.toml").write_text(BUILTIN.replace("B0001", "ACME_0001"))
    make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001")})
    with pytest.raises(SndrError) as exc:
        load_patch_set(d)
    assert [p.code for p in exc.value.problems] == ["duplicate_id"]


def test_runtime_code_must_come_from_the_pack_or_sndr(make_pack, builtins):
    make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001", replacement="os:getcwd")})
    with pytest.raises(SndrError) as exc:
        load_patch_set(builtins)
    assert exc.value.problems[0].code == "pack_module_outside"


def test_pack_patches_may_use_sndr_code(make_pack, builtins):
    make_pack("acme", {"ACME_0002-r.toml": pack_patch("ACME_0002", replacement="sndr.startup.runtime:call_counter")})
    assert "ACME_0002" in load_patch_set(builtins).by_id


def test_pack_patches_are_gated_like_built_ins(make_pack, builtins):
    from sndr.plan import enabled_set

    def enabled_ids(ps, version, environ):
        return list(enabled_set(ps, version, environ).ids)

    make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001", top={"default": "false", "vllm": '">=0.32"'})})
    ps = load_patch_set(builtins)
    assert enabled_ids(ps, "0.32.0", {}) == ["B0001"]
    assert enabled_ids(ps, "0.32.0", {"SNDR_ENABLE_ACME_0001": "1"}) == ["B0001", "ACME_0001"]
    assert enabled_ids(ps, "0.31.0", {"SNDR_ENABLE_ACME_0001": "1"}) == ["B0001"]


def test_resolved_set_allows_the_pack_module_for_its_own_patches_only(make_pack, builtins):
    from sndr.startup.resolve import build_resolved

    module = make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001")})
    resolved = build_resolved(load_patch_set(builtins), "0.32.0", {})
    assert resolved["patches"]["ACME_0001"]["allowed"] == ["sndr", module]
    assert resolved["patches"]["ACME_0001"]["pack"] == "acme"
    assert resolved["patches"]["B0001"]["allowed"] == ["sndr"]
    [rt] = resolved["runtime"]
    assert rt["allowed"] == ["sndr", module] and rt["replacement"] == f"{module}:fixed_answer"


def test_discovery_is_memoised_for_startup(make_pack, tmp_path, monkeypatch):
    from sndr.startup.hookcache import HookCache

    make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001")})
    cache = HookCache(str(tmp_path / "cache"))
    first = packs.discover_cached(cache)
    assert [p["name"] for p in first] == ["acme"]

    def boom():
        raise AssertionError("discovery must come from the memo")

    monkeypatch.setattr(packs, "discover", boom)
    assert packs.discover_cached(cache) == first


def test_installing_a_pack_changes_the_discovery_key(make_pack):
    before = packs.discovery_key()
    make_pack("acme", {"ACME_0001-r.toml": pack_patch("ACME_0001")})
    assert packs.discovery_key() != before


def test_hookimpl_is_exported_for_pack_authors():
    import pluggy

    assert isinstance(packs.hookimpl, pluggy.HookimplMarker)
    assert packs.id_prefix("acme-labs") == "ACME_LABS_"


def test_pack_documentation_example_parses():
    text = textwrap.dedent(packs.__doc__)
    assert '[project.entry-points."sndr.patches"]' in text
