"""The pin record, ``<patch dir>/_pin.toml``: the vLLM build the patch set is validated on.

Its reader lives in the core because the core reads it (:mod:`sndr.manifest`
validates on the pin it names); ``python -m sndr pin advance``
(:mod:`sndr.upstream.pin`) writes it when every gate passes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .env import PIN_FILE_NAME
from .errors import bad_input

__all__ = ["PIN_FILE_NAME", "PinRecord", "default_pin_path", "pin_version", "read_pin", "writable_pin_path"]



class PinRecord(BaseModel):
    """``patches/_pin.toml``: the vLLM build the patch set is validated on."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1)
    sha: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")
    tree_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    benchmark_ref: str | None = Field(default=None, description="the re-measured benchmark reference (path)")
    benchmark_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    benchmark_waived: str | None = Field(default=None, description="why no benchmark reference was required")
    perf_refs: list[str] | None = Field(default=None, description="per plugin to re-measure: 'ID path sha256' of "
                                        "its benchmark against the target's kernels (--perf-ref)")
    perf_waived: list[str] | None = Field(default=None, description="per plugin to re-measure: 'ID: reason' it "
                                          "was not re-measured (--no-perf-ref ID=REASON)")

    def to_toml(self) -> str:
        lines = ["# The pin: written by `python -m sndr pin advance` when every gate passes."]
        for k, v in self.model_dump(exclude_none=True).items():
            lines.append(f"{k} = {json.dumps(v)}")
        return "\n".join(lines) + "\n"


def default_pin_path(patches: Path | str | None = None) -> Path:
    """``<patch dir>/_pin.toml`` to READ (default dir: :func:`sndr.env.patches_dir`); writes go through
    :func:`writable_pin_path`."""
    from .env import patches_dir

    return (Path(patches) if patches is not None else patches_dir()) / PIN_FILE_NAME


def writable_pin_path(pin_file: Path | str | None = None, patches: Path | str | None = None) -> Path:
    """The pin file to WRITE: ``pin_file``, else ``<patches>/_pin.toml`` (default dir: ``$SNDR_PATCHES``);
    never an installed sndr's shipped data (``shipped_data_write``)."""
    from .env import refuse_shipped_write, writable_patches_dir

    if pin_file is not None:
        refuse_shipped_write(pin_file, flag="--pin-file PATH")
        return Path(pin_file)
    return writable_patches_dir(patches, flag="--patches DIR (or --pin-file PATH)") / PIN_FILE_NAME


def read_pin(path: Path | str) -> PinRecord | None:
    import tomllib

    path = Path(path)
    if not path.exists():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return PinRecord.model_validate(data)
    except tomllib.TOMLDecodeError as exc:
        raise bad_input("toml_syntax", f"malformed TOML: {exc}", file=str(path)) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise bad_input("bad_pin", err.get("msg", "invalid"), file=str(path),
                        key=".".join(str(p) for p in err.get("loc", ())) or None) from None


def pin_version(patches: Path | str | None) -> tuple[str, PinRecord | None]:
    """The pin a patch set is validated on, and the record naming it: ``<patches>/_pin.toml``'s version when
    it has one, else sndr's own pinned vLLM (:data:`sndr.PIN_VERSION`, record None)."""
    from . import PIN_VERSION

    rec = read_pin(default_pin_path(patches)) if patches is not None else None
    return (rec.version, rec) if rec is not None else (PIN_VERSION, None)
