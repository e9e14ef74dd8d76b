"""JSON Schemas from the models, and the reason-code registry (:data:`sndr.errors.CODES`) as a table or JSON
(the command: :mod:`sndr.commands.schema`)."""

from __future__ import annotations

import importlib
import json

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


def schema_names() -> list[str]:
    """Every name ``python -m sndr schema`` takes: the model schemas, then ``codes``."""
    return [*SCHEMAS, "codes"]
