"""``python -m sndr schema patch|report|preflight|ledger|manifest|config|profile``: JSON Schemas from the models;
``python -m sndr schema codes [--json]``: the reason-code registry (:data:`sndr.errors.CODES`)."""

from __future__ import annotations

import importlib
import json
import sys

# name -> (module, model class)
SCHEMAS = {
    "patch": ("sndr.model", "Patch"),
    "report": ("sndr.model", "Report"),
    "ledger": ("sndr.model", "Ledger"),
    "preflight": ("sndr.preflight.models", "PreflightReport"),
    "manifest": ("sndr.manifest", "Manifest"),
    "config": ("sndr.preflight.configmodels", "ConfigDrift"),
    "profile": ("sndr.profile", "Profile"),
}


def schema_of(name: str) -> dict:
    if name == "profile":  # stdlib-only module (the startup path uses it): a hand-built schema
        from .profile import profile_schema

        return profile_schema()
    module, cls = SCHEMAS[name]
    model = getattr(importlib.import_module(module), cls)
    schema = model.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    schema.setdefault("title", cls)
    return schema


def codes_table(as_json: bool = False) -> str:
    """``sndr.errors.CODES``: every reason code with its exit status and one-line meaning."""
    from .errors import CODES

    if as_json:
        return json.dumps({c: {"exit": e.exit, "meaning": e.meaning} for c, e in sorted(CODES.items())}, indent=2)
    width = max(len(c) for c in CODES)
    lines = [f"{'code':<{width}}  exit  meaning"]
    lines += [f"{c:<{width}}  {e.exit:>4}  {e.meaning}" for c, e in sorted(CODES.items())]
    return "\n".join(lines)


def cli_main(argv: list[str] | None = None) -> int:
    from .cli import run

    argv = list(sys.argv[1:] if argv is None else argv)
    return run("sndr schema", lambda: _cli_body(argv))


def schema_names() -> list[str]:
    """Every name ``python -m sndr schema`` takes: the model schemas, then ``codes``."""
    return [*SCHEMAS, "codes"]


def _cli_body(argv: list[str]) -> int:
    names = schema_names()
    if argv[:1] == ["codes"] and argv[1:] in ([], ["--json"]):
        print(codes_table(as_json=argv[1:] == ["--json"]))
        return 0
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        print(f"usage: python -m sndr schema {{{'|'.join(names)}}}   (codes [--json]: every reason code, "
              f"its exit status and meaning)", file=sys.stderr)
        return 2
    print(json.dumps(schema_of(argv[0]), indent=2, sort_keys=True))
    return 0
