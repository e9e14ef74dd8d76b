"""Deployment profiles and ``when`` applicability predicates (standard library only).

A patch's ``when = { ... }`` table says which deployments it is for; a
*deployment profile* says what one deployment is. Both use the keys of
:data:`KEYS`. ``plan.enabled_set`` (the one home of gating) calls
:func:`evaluate` for every enabled patch with a ``when``: a patch whose table
does not match is gated ``when_mismatch``; one whose table names a key the
profile does not know is gated ``when_unknown``. sndr never guesses a value.

Where the profile comes from:

* ``python -m sndr.apply --profile FILE`` / ``python -m sndr list --profile FILE``,
  or ``$SNDR_PROFILE`` (a TOML or JSON file; schema:
  ``python -m sndr schema profile``; format: ``docs/format.md``);
* inside a vLLM process (the startup hook), :func:`process_profile`: the
  declared profile (``$SNDR_PROFILE``) overlaid with what the process itself
  knows, cheaply: the platform and GPU capability from torch when torch is
  already imported (and CUDA already initialised, for the capability), and the
  vLLM arguments from the process's own command line, parsed with vLLM's own
  argument parser when vLLM is installed. The command line is only parsed when
  a ``when`` asks for one of its keys.

This module imports only the standard library, :mod:`sndr.errors`, :mod:`sndr.fsio` and
:mod:`sndr.modelconfig` (what a model's config.json says): the startup path uses it in every
vLLM process.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping

from . import modelconfig
from .errors import EXIT_BAD_INPUT, Problem, SndrError
from .fsio import FileProblem, read_regular, read_text_strict

#: The predicate keys: key -> (kind, meaning). ``str`` keys match a value or a
#: list of values (shell-style patterns such as ``"fp8*"`` allowed);
#: ``capability`` keys match a PEP 440-style range such as ``">=8.9"``.
KEYS: dict[str, tuple[str, str]] = {
    "model_arch": ("str", "the model's architecture class, as in its config.json `architectures` "
                          "(e.g. Qwen3NextForCausalLM)"),
    "quantization": ("str", "vLLM --quantization (e.g. fp8, awq, gptq_marlin); \"none\" when unquantised"),
    "kv_cache_dtype": ("str", "vLLM --kv-cache-dtype (e.g. auto, fp8, fp8_e4m3, turboquant_k8v4)"),
    "spec_method": ("str", "speculative decoding method, vLLM --speculative-config's method "
                           "(e.g. mtp, eagle, eagle3, ngram); \"none\" without speculative decoding"),
    "platform": ("str", "cuda, rocm, cpu, xpu or tpu"),
    "gpu_capability": ("capability", "GPU compute capability major.minor (e.g. 9.0); a when-range "
                                     "such as \">=8.9\" or \">=8.0,<9.0\""),
    "model_class": ("str", "the model family, as the `model_type` of its config.json (e.g. qwen3_next, qwen3_5, "
                           "llama)"),
    "is_hybrid": ("bool", "true when the model mixes attention with Mamba or linear-attention layers (config.json "
                          "`layer_types`, `layers_block_type` or `hybrid_override_pattern`), else false"),
    "quant_format": ("str", "the checkpoint's quantization format, config.json `quantization_config.quant_method` "
                            "lower-cased with '-' as '_' (e.g. fp8, compressed_tensors, auto_round, awq, gptq); "
                            "\"none\" without one"),
    "tool_call_parser": ("str", "vLLM serve --tool-call-parser (e.g. qwen3_coder, qwen3_xml, hermes); \"none\" "
                                "without one"),
}

#: Keys the startup hook reads from the vLLM command line (and the model's config.json it names).
ARG_KEYS = ("model_arch", "quantization", "kv_cache_dtype", "spec_method", "model_class", "is_hybrid",
            "quant_format", "tool_call_parser")

#: A ``when`` entry that matches any value of its key, an unknown one included.
ANY = "*"

#: Keys read from the model's config.json (through the model the command line names).
_CONFIG_KEYS = modelconfig.CONFIG_KEYS

#: Keys whose every value is one of a closed vocabulary (what the hook can ever report for them).
VOCAB: dict[str, tuple[str, ...]] = {"platform": ("cuda", "rocm", "cpu", "xpu", "tpu")}
#: The form of every other ``str`` key's values: vLLM's own values are lower case
#: (``fp8_e4m3``, ``compressed-tensors``, ``eagle3``); an architecture is a Python class name.
#: Shell-pattern characters are allowed in a ``when`` value.
_FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "model_arch": (re.compile(r"^[A-Za-z0-9_*?\[\]!]+$"), "a model class name such as Qwen3NextForCausalLM"),
    **{k: (re.compile(r"^[a-z0-9_.\-*?\[\]!]+$"), "lower case, as vLLM spells it (e.g. fp8, fp8_e4m3, mtp)")
       for k in ("quantization", "kv_cache_dtype", "spec_method")},
}


def check_value(key: str, value: str, pattern: bool) -> None:
    """Raise ``ValueError`` when ``value`` (a ``when`` pattern, or a profile fact) of ``key`` can never be
    what the deployment reports: outside the key's vocabulary (:data:`VOCAB`; a pattern must match a
    word of it) or not of the key's form, naming the nearest word."""
    import difflib

    words = VOCAB.get(key)
    if words is not None:
        if any(fnmatch.fnmatchcase(w, value) if pattern else w == value for w in words):
            return
        near = difflib.get_close_matches(value.lower(), words, n=1)
        raise ValueError(f"{key} {value!r} matches none of {', '.join(words)}"
                         + (f" (did you mean {near[0]!r}?)" if near else ""))
    form = _FORMS.get(key)
    if form is not None and not form[0].match(value):
        raise ValueError(f"{key} {value!r} is not a value vLLM reports: {form[1]}")



_PROFILE_META = ("name", "description")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+)(?:\.(\d+))?\s*$")
_CAPABILITY = re.compile(r"^\s*(\d+)\.(\d+)\s*$")

NO_PROFILE = "no deployment profile (pass --profile FILE or set SNDR_PROFILE)"


# ----------------------------------------------------------------------------- when tables


def parse_capability(value: str) -> tuple[int, int]:
    m = _CAPABILITY.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"gpu_capability {value!r} is not major.minor (e.g. \"9.0\")")
    return int(m.group(1)), int(m.group(2))


def _parse_range(spec: str) -> list[tuple[str, tuple[int, int]]]:
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"gpu_capability range {spec!r} is empty; write e.g. \">=8.9\"")
    out = []
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"gpu_capability range {spec!r}: {clause.strip()!r} is not OP MAJOR[.MINOR] "
                             "with OP one of >= <= == != > <")
        out.append((m.group(1), (int(m.group(2)), int(m.group(3) or 0))))
    return out


def _in_range(cap: tuple[int, int], spec: str) -> bool:
    ops = {">=": cap.__ge__, "<=": cap.__le__, "==": cap.__eq__, "!=": cap.__ne__, ">": cap.__gt__, "<": cap.__lt__}
    return all(ops[op](bound) for op, bound in _parse_range(spec))


def check_when(when: Mapping) -> dict:
    """Validate a ``when`` table; raise ``ValueError`` naming the offending key. Returns it normalised."""
    if not isinstance(when, Mapping):
        raise ValueError("when must be a table, e.g. when = { kv_cache_dtype = \"fp8*\" }")
    if not when:
        raise ValueError("when is empty; leave it out for a patch that applies to every deployment")
    out: dict = {}
    for key, value in when.items():
        if key not in KEYS:
            raise ValueError(f"when: unknown key {key!r}; known keys: {', '.join(KEYS)}")
        kind = KEYS[key][0]
        if value == ANY or (isinstance(value, list) and ANY in value):
            out[key] = value  # any value, an unknown one included
            continue
        if kind == "capability":
            _parse_range(value)
            out[key] = value
            continue
        if kind == "bool":
            out[key] = [_bool_when(key, v) for v in value] if isinstance(value, list) and value \
                else _bool_when(key, value)
            continue
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise ValueError(f"when.{key} must be a non-empty string or a non-empty list of strings")
        for v in values:
            try:
                check_value(key, v, pattern=True)
            except ValueError as exc:
                raise ValueError(f"when.{exc}") from None
        out[key] = value
    return out


def _bool_when(key: str, value) -> str:
    """A boolean key's value, as the string "true" or "false" (TOML true/false or those strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower()
    raise ValueError(f"when.{key} must be true or false (got {value!r})")


# ----------------------------------------------------------------------------- profiles


class Profile:
    """What one deployment is: key -> value, where each value came from, and why a key is unknown.

    ``lazy`` maps a key to a function returning ``(value or None, source or
    reason)``, evaluated on first use (the startup hook parses the command
    line only when a ``when`` asks for one of its keys).
    """

    def __init__(self, facts: Mapping[str, str] | None = None, *, source: str = "", missing: str = NO_PROFILE,
                 sources: Mapping[str, str] | None = None,
                 lazy: Mapping[str, Callable[[], tuple[str | None, str]]] | None = None,
                 fingerprint_parts: Iterable[str] = (), force: Iterable[str] = ()):
        self.facts: dict[str, str] = dict(facts or {})
        #: Patch ids the operator enables even where their ``when`` needs a key this profile does not know.
        self.force: frozenset[str] = frozenset(force)
        self.source = source
        self.sources: dict[str, str] = dict(sources or {k: source for k in self.facts})
        self.missing = missing  # why a key with no fact and no lazy provider is unknown
        self.unknown: dict[str, str] = {}
        self.conflicts: list[str] = []  # declared vs process facts that disagree
        self._lazy = dict(lazy or {})
        self._fp = list(fingerprint_parts)
        # The inputs, as constructed: fingerprint() never changes as lazy keys resolve.
        self._inputs = json.dumps([sorted(self.facts.items()), sorted(self._lazy), self._fp, self.missing,
                                   sorted(self.force)])

    def get(self, key: str) -> tuple[str | None, str]:
        """(value, where it came from) or (None, why it is unknown)."""
        if key in self._lazy:
            value, why = self._lazy.pop(key)()
            if value is not None:
                declared = self.facts.get(key)
                if declared is not None and declared != value:
                    self.conflicts.append(f"{key}: the profile declares {declared!r} ({self.sources.get(key)}) "
                                          f"but this process has {value!r} ({why}); using {value!r}")
                self.facts[key], self.sources[key] = value, why
            elif key not in self.facts:
                self.unknown[key] = why
        if key in self.facts:
            return self.facts[key], self.sources.get(key, self.source)
        return None, self.unknown.get(key, self.missing)

    def fingerprint(self) -> str:
        """sha256 of every input the facts derive from (never forces a lazy key)."""
        return hashlib.sha256(self._inputs.encode()).hexdigest()

    def to_json(self) -> dict:
        return {"source": self.source, "facts": dict(sorted(self.facts.items())), "force": sorted(self.force),
                "sources": dict(sorted(self.sources.items())), "unknown": dict(sorted(self.unknown.items())),
                "conflicts": list(self.conflicts)}


def _bad(message: str, path: str, line: int | None = None, key: str | None = None) -> SndrError:
    return SndrError(Problem("bad_profile", message, file=path, line=line, key=key,
                             hint="see docs/format.md (deployment profiles) or python -m sndr schema profile"),
                     EXIT_BAD_INPUT)


def _line_of_key(text: str, key: str) -> int | None:
    pat = re.compile(r'^\s*"?' + re.escape(key) + r'"?\s*[=:]', re.M)
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def parse_profile(text: str, path: str) -> Profile:
    """A profile from TOML (or JSON, for a ``.json`` path). Unknown keys and bad values are errors."""
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _bad(f"not valid JSON: {exc}", path, getattr(exc, "lineno", None)) from None
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"at line (\d+)", str(exc))
            raise _bad(f"malformed TOML: {exc}", path, int(m.group(1)) if m else None) from None
    if not isinstance(data, dict):
        raise _bad("a profile is a table of key = \"value\"", path)
    facts: dict[str, str] = {}
    force: list[str] = []
    for key, value in data.items():
        line = _line_of_key(text, key)
        if key == "force":
            if not isinstance(value, list) or not all(isinstance(v, str) and re.match(r"^[A-Za-z][A-Za-z0-9_-]*$", v)
                                                      for v in value):
                raise _bad("force must be a list of patch ids, e.g. force = [\"PN0007\"]", path, line, key)
            force = list(value)
            continue
        if key in _PROFILE_META:
            if not isinstance(value, str):
                raise _bad(f"{key} must be a string", path, line, key)
            continue
        if key not in KEYS:
            raise _bad(f"unknown key {key!r}; known keys: {', '.join(KEYS)}", path, line, key)
        if KEYS[key][0] == "bool":
            try:
                facts[key] = _bool_when(key, value)
            except ValueError:
                raise _bad(f"{key} must be true or false", path, line, key) from None
            continue
        if not isinstance(value, str) or not value.strip():
            raise _bad(f"{key} must be a non-empty string", path, line, key)
        try:
            if KEYS[key][0] == "capability":
                parse_capability(value)
            else:
                check_value(key, value, pattern=False)
        except ValueError as exc:
            raise _bad(str(exc), path, line, key) from None
        facts[key] = value
    return Profile(facts, source=f"profile {path}",
                   missing=f"the profile {path} does not set it",
                   fingerprint_parts=[path, hashlib.sha256(text.encode()).hexdigest()], force=force)


def load_profile(path: str | os.PathLike) -> Profile:
    path = os.fspath(path)
    try:
        text = read_text_strict(path, max_bytes=1 << 20, what="profile")
    except FileProblem as exc:
        raise _bad(exc.message, path, exc.line) from None
    return parse_profile(text, path)


def profile_from_environ(environ=None) -> Profile:
    """``$SNDR_PROFILE`` when set and non-empty, else the empty profile (every key unknown)."""
    from .env import PROFILE

    environ = os.environ if environ is None else environ
    path = environ.get(PROFILE)
    if path:
        return load_profile(path)
    return Profile()


_PROCESS: list = []  # [(pid, Profile)]: the startup hook's profile of this process


def use_process_profile(profile: Profile | None) -> None:
    """The startup hook registers the profile of this vLLM process (None: forget it)."""
    _PROCESS[:] = [] if profile is None else [(os.getpid(), profile)]


def active_profile(environ=None) -> Profile:
    """What ``when`` is evaluated against when no profile is passed explicitly.

    In a vLLM process whose startup hook registered one: the process profile.
    Elsewhere: ``$SNDR_PROFILE``, else the empty profile.
    """
    if _PROCESS and _PROCESS[0][0] == os.getpid():
        return _PROCESS[0][1]
    return profile_from_environ(environ)


def active_fingerprint(environ=None) -> str:
    """A digest of what :func:`active_profile` would read (for the startup hook's memo keys); "" without one."""
    from .env import PROFILE

    if _PROCESS and _PROCESS[0][0] == os.getpid():
        return _PROCESS[0][1].fingerprint()
    environ = os.environ if environ is None else environ
    path = environ.get(PROFILE)
    if not path:
        return ""
    try:  # never a blocking open: a FIFO or device at SNDR_PROFILE is refused (load_profile says why)
        data = read_regular(path, 1 << 20, what="profile")
    except FileProblem as exc:
        data = f"unreadable: {exc.code}".encode()
    except ValueError:  # a NUL in the path
        data = b"unreadable: bad path"
    return hashlib.sha256(path.encode() + b"\0" + data).hexdigest()


# ----------------------------------------------------------------------------- evaluation


def _matches(value: str, want) -> bool:
    return any(fnmatch.fnmatchcase(value, w) for w in ([want] if isinstance(want, str) else want))


def evaluate(when: Mapping, profile: Profile, patch_id: str | None = None) -> tuple[bool, str, str]:
    """(applies, code, reason) of a ``when`` table on a profile. Codes: when_mismatch, when_unknown, and
    when_forced (applies: the operator forced ``patch_id`` on despite unknown keys).

    Every key must match; the first key that does not decides the reason. An
    unknown key makes the patch not applicable (never a guess), unless the entry
    is ``"*"`` (any value, an unknown one included) or the profile's ``force``
    names the patch. A key that is known and does not match always gates.
    """
    forced: list[str] = []
    for key, want in when.items():
        if want == ANY or (isinstance(want, list) and ANY in want):
            continue
        value, where = profile.get(key)
        if value is None:
            if patch_id is not None and patch_id in profile.force:
                forced.append(f"when.{key} = {want!r} with {key} unknown ({where})")
                continue
            return False, "when_unknown", f"when.{key} = {want!r}, but {key} is unknown: {where}"
        if KEYS[key][0] == "capability":
            try:
                ok = _in_range(parse_capability(value), want)
            except ValueError as exc:
                return False, "when_unknown", f"when.{key}: {exc} ({where})"
        else:
            ok = _matches(value, want)
        if not ok:
            return False, "when_mismatch", f"when.{key} = {want!r} does not match {value!r} ({where})"
    if forced:
        return True, "when_forced", f"forced on by the profile's force list: {'; '.join(forced)}"
    return True, "", ""


# ----------------------------------------------------------------------------- inside a vLLM process


def _torch_facts() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Platform and GPU capability from torch, only if torch is already imported (never imports it)."""
    facts: dict[str, str] = {}
    sources: dict[str, str] = {}
    unknown: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is None:
        unknown["platform"] = unknown["gpu_capability"] = "torch is not imported in this process yet"
        return facts, sources, unknown
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        facts["platform"] = "rocm"
    elif getattr(version, "cuda", None):
        facts["platform"] = "cuda"
    else:
        unknown["platform"] = "torch is neither a CUDA nor a ROCm build"
    if "platform" in facts:
        sources["platform"] = "torch.version"
    cuda = getattr(torch, "cuda", None)
    try:
        initialised = bool(cuda is not None and cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken torch must not break startup
        initialised = False
    if initialised and cuda is not None:  # (initialised implies it)
        try:
            major, minor = cuda.get_device_capability()
            facts["gpu_capability"], sources["gpu_capability"] = f"{major}.{minor}", "torch.cuda"
        except Exception as exc:  # noqa: BLE001
            unknown["gpu_capability"] = f"torch.cuda.get_device_capability() failed: {type(exc).__name__}"
    else:
        unknown["gpu_capability"] = "CUDA is not initialised in this process (sndr never initialises it)"
    return facts, sources, unknown


def _vllm_parser():
    """vLLM's own engine-argument parser, or raise (ImportError when vLLM is not installed)."""
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415 - only when a when needs it

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser
    return EngineArgs.add_cli_args(FlexibleArgumentParser(add_help=False))


def _engine_argv(argv: list[str]) -> tuple[list[str], str | None]:
    """The engine arguments of a command line: ``vllm serve MODEL --x`` -> (--x..., MODEL)."""
    args = list(argv[1:])
    if args and args[0] == "serve":
        args = args[1:]
        if args and not args[0].startswith("-"):
            return args[1:], args[0]
    return args, None


def _read_args(argv: list[str], parser_factory=None) -> tuple[dict | None, str]:
    """The vLLM arguments (model, revision, quantization, kv_cache_dtype, speculative_config) or (None, why)."""
    rest, positional = _engine_argv(argv)
    factory = parser_factory or _vllm_parser
    try:
        parser = factory()
    except ImportError:
        return None, "vLLM is not installed here, so its argument parser is unavailable"
    except Exception as exc:  # noqa: BLE001 - vLLM's own failure, reported, never guessed around
        return None, f"vLLM's argument parser could not be built ({type(exc).__name__}: {exc})"
    try:
        ns, _unknown = parser.parse_known_args(rest)
    except SystemExit:
        return None, "vLLM's argument parser rejected this process's command line"
    except Exception as exc:  # noqa: BLE001
        return None, f"vLLM's argument parser failed on this command line ({type(exc).__name__}: {exc})"
    out = vars(ns)
    if positional is not None:
        out["model"] = positional
    return out, "the command line (vLLM's argument parser)"


def process_profile(environ=None, argv: list[str] | None = None, parser_factory=None) -> Profile:
    """The profile of this vLLM process: ``$SNDR_PROFILE`` overlaid with what the process knows.

    torch facts are read now (cheap, never importing torch or initialising
    CUDA); the vLLM arguments are parsed on first use only. A fact the process
    knows wins over the declared one, and the disagreement is recorded in
    ``profile.conflicts`` (the attestation carries it).
    """
    environ = os.environ if environ is None else environ
    argv = list(sys.argv if argv is None else argv)
    declared = profile_from_environ(environ)
    facts, sources, unknown = _torch_facts()
    parsed: dict = {}

    def args() -> tuple[dict | None, str]:
        if "result" not in parsed:
            parsed["result"] = _read_args(argv, parser_factory)
        return parsed["result"]

    def from_args(key: str) -> Callable[[], tuple[str | None, str]]:
        def get() -> tuple[str | None, str]:
            if key == "tool_call_parser":  # a serve (frontend) argument: not one of the engine's
                return modelconfig.tool_call_parser(argv)
            ns, where = args()
            if ns is None:
                return None, where
            if key in _CONFIG_KEYS:
                if "config" not in parsed:
                    parsed["config"] = modelconfig.read_config(ns.get("model"), ns.get("revision"), environ)
                config, path = parsed["config"]
                return modelconfig.fact(key, config, path) if config is not None else (None, path)
            if key == "quantization":
                return (ns.get("quantization") or "none"), where
            if key == "kv_cache_dtype":
                return str(ns.get("kv_cache_dtype") or "auto"), where
            spec = ns.get("speculative_config")
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except ValueError:
                    return None, "--speculative-config is not JSON"
            if not spec:
                return "none", where
            method = spec.get("method") if isinstance(spec, dict) else None
            return (str(method), where) if method else (None, "--speculative-config has no method")
        return get

    lazy = {k: from_args(k) for k in ARG_KEYS}
    merged = Profile(declared.facts, source=declared.source or "this process", missing=declared.missing,
                     sources=declared.sources, lazy=lazy, force=declared.force,
                     fingerprint_parts=declared._fp + ["argv", json.dumps(argv),
                                                       json.dumps(sorted(facts.items()))])
    for key, value in facts.items():
        if key in merged.facts and merged.facts[key] != value:
            merged.conflicts.append(f"{key}: the profile declares {merged.facts[key]!r} but this process has "
                                    f"{value!r} ({sources[key]}); using {value!r}")
        merged.facts[key], merged.sources[key] = value, sources[key]
    for key, why in unknown.items():
        if key not in merged.facts:
            merged.unknown[key] = why
    return merged


# ----------------------------------------------------------------------------- schema


def profile_schema() -> dict:
    """JSON Schema of a deployment profile (``python -m sndr schema profile``)."""
    props: dict = {k: {"type": "string", "description": d} for k, (_, d) in KEYS.items()}
    props["gpu_capability"]["pattern"] = r"^\d+\.\d+$"
    for k, (kind, d) in KEYS.items():
        if kind == "bool":
            props[k] = {"description": d, "anyOf": [{"type": "boolean"}, {"enum": ["true", "false"]}]}
    props["force"] = {"type": "array", "items": {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9_-]*$"},
                      "description": "patch ids enabled even where their `when` needs a key this profile does not "
                                     "know (when_forced); a key that is known and does not match still gates"}
    props["name"] = {"type": "string", "description": "a label for people"}
    props["description"] = {"type": "string"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Profile",
            "description": "A deployment profile: what one vLLM deployment is. A key left out is unknown, and a "
                           "patch whose `when` needs it is gated `when_unknown`. TOML or JSON; see docs/format.md.",
            "type": "object", "additionalProperties": False, "properties": props}


def when_schema() -> dict:
    props: dict = {}
    for k, (kind, d) in KEYS.items():
        if kind == "capability":
            props[k] = {"type": "string", "description": d}
        elif kind == "bool":
            one = {"anyOf": [{"type": "boolean"}, {"enum": ["true", "false", ANY]}]}
            props[k] = {"description": d, "anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
        else:
            props[k] = {"description": d, "anyOf": [{"type": "string", "minLength": 1},
                                                    {"type": "array", "items": {"type": "string", "minLength": 1},
                                                     "minItems": 1}]}
    return {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": props}
