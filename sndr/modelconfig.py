"""What a model's config.json and a vLLM command line say, for the ``when`` keys (standard library only).

:mod:`sndr.profile` asks this module, in a vLLM process, for the keys it reads from the model
vLLM would load (``model_arch``, ``model_class``, ``is_hybrid``, ``quant_format``) and for the
serve argument ``tool_call_parser``. Every answer is a value with where it came from, or
``None`` with why it is unknown: never a guess. The startup path imports it: the stdlib and sndr.fsio only (files read without blocking on a FIFO).
"""

from __future__ import annotations

import json
import os
import re

from .fsio import FileProblem, read_regular

#: Keys read from the model's config.json (through the model the command line names).
CONFIG_KEYS = ("model_arch", "model_class", "is_hybrid", "quant_format")


def read_config(model: str | None, revision: str | None, environ) -> tuple[dict | None, str]:
    """The config.json vLLM would read (a local directory, or the HF cache's snapshot): (config, path) or
    (None, why)."""
    if not model:
        return None, "the command line names no model"
    candidates = []
    if os.path.isdir(model):
        candidates.append(os.path.join(model, "config.json"))
    else:
        hub = environ.get("HF_HUB_CACHE") or os.path.join(
            environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
        repo = os.path.join(hub, "models--" + model.replace("/", "--"))
        ref = os.path.join(repo, "refs", revision or "main")
        try:
            commit = read_regular(ref, 4096, what="model ref").decode("utf-8", "replace").strip()
            candidates.append(os.path.join(repo, "snapshots", commit, "config.json"))
        except (FileProblem, ValueError):
            if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
                candidates.append(os.path.join(repo, "snapshots", revision, "config.json"))
    for path in candidates:
        try:  # a FIFO or device is refused without blocking, a huge file without reading it
            config = json.loads(read_regular(path, 4 << 20, what="model config"))
        except (FileProblem, ValueError, RecursionError):
            continue
        if isinstance(config, dict):
            return config, path
        return None, f"{path} is not a JSON object"
    return None, f"no local config.json for model {model!r} (not a directory, not in the Hugging Face cache)"


#: Layer kinds of config.json ``layer_types`` / ``layers_block_type`` that are attention (anything else:
#: Mamba, linear attention, ... makes the model hybrid).
_ATTENTION_LAYERS = {"attention", "full_attention", "sliding_attention", "global_attention", "local_attention",
                     "chunked_attention", "hybrid_attention"}


def fact(key: str, config: dict, path: str) -> tuple[str | None, str]:
    """One config-derived key (``_CONFIG_KEYS``) from a model's config.json, or (None, why): never a guess."""
    if key == "model_arch":
        archs = config.get("architectures")
        if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str):
            return archs[0], f"{path} (architectures)"
        return None, f"{path} has no single entry in architectures ({archs!r})"
    if key == "model_class":
        mt = config.get("model_type")
        return (mt, f"{path} (model_type)") if isinstance(mt, str) and mt else (None, f"{path} has no model_type")
    if key == "quant_format":
        q = config.get("quantization_config")
        if q is None:
            return "none", f"{path} (no quantization_config)"
        method = q.get("quant_method") if isinstance(q, dict) else None
        if isinstance(method, str) and method:
            return method.lower().replace("-", "_"), f"{path} (quantization_config.quant_method)"
        return None, f"{path} has a quantization_config without quant_method"
    # is_hybrid: what the config says about its layers, in it or its text_config.
    for cfg in (config, config.get("text_config")):
        if not isinstance(cfg, dict):
            continue
        pattern = cfg.get("hybrid_override_pattern")
        if isinstance(pattern, str) and pattern:
            return ("true" if "M" in pattern else "false"), f"{path} (hybrid_override_pattern)"
        for field in ("layer_types", "layers_block_type"):
            kinds = cfg.get(field)
            if isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds):
                hybrid = any(k.lower() not in _ATTENTION_LAYERS for k in kinds)
                return ("true" if hybrid else "false"), f"{path} ({field})"
    return None, (f"{path} names no layer kinds (layer_types, layers_block_type, hybrid_override_pattern); "
                  "declare is_hybrid in the profile")


def tool_call_parser(argv: list[str]) -> tuple[str | None, str]:
    """vLLM serve's --tool-call-parser from the command line ("none" without one: vLLM's default)."""
    for i, arg in enumerate(argv):
        for flag in ("--tool-call-parser", "--tool_call_parser"):
            if arg == flag:
                if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                    return argv[i + 1], "the command line"
                return None, f"{flag} has no value on the command line"
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1:], "the command line"
    return "none", "the command line (no --tool-call-parser)"
