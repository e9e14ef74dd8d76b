"""A vLLM wheel read in place as a :class:`sndr.treeview.Tree` (``--tree path/to/vllm-X.whl``)."""

from __future__ import annotations

import re
import threading
import zipfile
from pathlib import Path

from .errors import bad_input
from .treespec import PKG as _PKG
from .treeview import Tree, check_rel, is_source

__all__ = ["WheelTree"]


class WheelTree(Tree):
    """A wheel read in place: members are decompressed on demand, never extracted."""

    kind = "wheel"

    def __init__(self, path: Path, spec: str | None = None):
        self.path = Path(path)
        self.spec = str(spec if spec is not None else path)
        self.root = None
        try:
            self._zip = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise bad_input("tree_not_found", f"wheel {self.path} does not exist", file=str(self.path)) from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise bad_input("bad_wheel", f"{self.path} is not a readable wheel: {exc}", file=str(self.path)) from None
        self._members = {i.filename: i for i in self._zip.infolist() if not i.is_dir()}
        self._files = sorted(n for n in self._members if is_source(n))
        self._lock = threading.Lock()
        if not self._files:
            self._zip.close()
            raise bad_input("no_vllm", f"wheel {self.path} contains no vllm/*.py files", file=str(self.path))

    def files(self) -> list[str]:
        return list(self._files)

    def read_bytes(self, rel: str) -> bytes | None:
        info = self._members.get(check_rel(rel))
        if info is None:
            return None
        with self._lock:
            return self._zip.read(info)

    def exists(self, rel: str) -> bool:
        return check_rel(rel) in self._members

    def metadata(self) -> str | None:
        names = sorted(n for n in self._members if re.fullmatch(rf"{_PKG}-[^/]+\.dist-info/METADATA", n))
        if not names:
            return None
        return (self.read_bytes(names[0]) or b"").decode("utf-8", "replace")

    def _fallback_version(self) -> str | None:
        parts = self.path.name.split("-")
        return parts[1] if len(parts) >= 5 else None

    def close(self) -> None:
        self._zip.close()

