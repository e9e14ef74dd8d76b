"""``python -m sndr schema patch|report|preflight|ledger|manifest|config``: JSON Schemas from the models."""

from __future__ import annotations

import importlib
import json
import sys

# name -> (module, model class)
SCHEMAS = {
    "patch": ("sndr.model", "Patch"),
    "report": ("sndr.model", "Report"),
    "ledger": ("sndr.model", "Ledger"),
    "preflight": ("sndr.preflight.report", "PreflightReport"),
    "manifest": ("sndr.manifest", "Manifest"),
    "config": ("sndr.preflight.configdrift", "ConfigDrift"),
}


def schema_of(name: str) -> dict:
    module, cls = SCHEMAS[name]
    model = getattr(importlib.import_module(module), cls)
    schema = model.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    schema.setdefault("title", cls)
    return schema


def cli_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        print(f"usage: python -m sndr schema {{{'|'.join(SCHEMAS)}}}", file=sys.stderr)
        return 2
    print(json.dumps(schema_of(argv[0]), indent=2, sort_keys=True))
    return 0
