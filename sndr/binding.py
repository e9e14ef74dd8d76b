"""Static binding of runtime-patch targets: find ``module:Qual.name`` in source text.

The same function serves the preflight (reading a candidate tree that is not
installed) and the runtime check (reading the imported module's file), so the
two can never disagree about a signature or a source hash.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Binding:
    file: str
    line: int
    qualname: str
    signature: str | None  # normalised parameter list, None for non-functions
    source_sha256: str


def module_file_candidates(module: str) -> list[str]:
    base = module.replace(".", "/")
    return [base + ".py", base + "/__init__.py"]


def normalise_signature(args: ast.arguments) -> str:
    """Parameter names and kinds only: ``(self, a, b=, /, *, c=, **kw)``.

    Annotations and default values are left out on purpose: they are not
    comparable between a static read and a live object, and renaming, adding
    or removing parameters is what breaks a replacement.
    """
    parts: list[str] = []
    pos = list(args.posonlyargs) + list(args.args)
    n_def = len(args.defaults)
    first_def = len(pos) - n_def
    for i, a in enumerate(pos):
        parts.append(a.arg + ("=" if i >= first_def else ""))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg:
        parts.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        parts.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        parts.append(a.arg + ("=" if d is not None else ""))
    if args.kwarg:
        parts.append("**" + args.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def signature_of_callable(obj) -> str | None:
    """The same normalised form, from a live object (for runtime checks)."""
    import inspect

    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    parts: list[str] = []
    kinds = inspect.Parameter
    saw_kwonly_marker = False
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        if p.kind == kinds.KEYWORD_ONLY and not saw_kwonly_marker and not any(q.kind == kinds.VAR_POSITIONAL for q in params):
            parts.append("*")
            saw_kwonly_marker = True
        if p.kind == kinds.VAR_POSITIONAL:
            parts.append("*" + p.name)
        elif p.kind == kinds.VAR_KEYWORD:
            parts.append("**" + p.name)
        else:
            parts.append(p.name + ("=" if p.default is not p.empty else ""))
        if p.kind == kinds.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind != kinds.POSITIONAL_ONLY):
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


@lru_cache(maxsize=32)
def _parse(text: str) -> ast.Module | None:
    # Memoised: runtime edits on one module and the base-class walk parse the
    # same (often 100 KB+) text repeatedly.
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def find_binding(text: str, qualname: str, file: str = "") -> Binding | None:
    """Locate ``Qual.name`` (class/function/assignment) at module level in ``text``."""
    tree = _parse(text)
    if tree is None:
        return None
    node: ast.AST = tree
    for part in qualname.split("."):
        found: ast.AST | None = None
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child
            elif isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == part for t in child.targets):
                found = child
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and child.target.id == part:
                found = child
        if found is None:
            return None
        node = found
    seg = ast.get_source_segment(text, node) or ""
    sig = normalise_signature(node.args) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    return Binding(file=file, line=getattr(node, "lineno", 0), qualname=qualname, signature=sig,
                   source_sha256=hashlib.sha256(seg.encode()).hexdigest())


def imported_from(text: str, name: str, module: str, is_package: bool) -> tuple[str, str] | None:
    """If ``name`` is bound by a module-level ``from X import y [as name]``, return (X, y).

    Relative imports are resolved against ``module``.
    """
    tree = _parse(text)
    if tree is None:
        return None
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts)
                src = f"{base}.{node.module}" if node.module else base
            else:
                src = node.module or ""
            return src, alias.name
    return None


def _class_bases(text: str, qual: str) -> list[str]:
    """Names of the base classes of class ``qual`` in ``text`` (simple names and dotted tails)."""
    module: ast.AST | None = _parse(text)
    if module is None:
        return []
    node: ast.AST = module
    for part in qual.split("."):
        found = next((c for c in getattr(node, "body", []) if isinstance(c, ast.ClassDef) and c.name == part), None)
        if found is None:
            return []
        node = found
    assert isinstance(node, ast.ClassDef)
    out = []
    for b in node.bases:
        if isinstance(b, ast.Name):
            out.append(b.id)
        elif isinstance(b, ast.Subscript) and isinstance(b.value, ast.Name):  # Generic[T]-style bases
            out.append(b.value.id)
    return out


def resolve_binding(module: str, qual: str, read_text, hops: int = 0) -> tuple[Binding | None, str | None, str]:
    """Find ``module:qual`` statically, following re-exports (``from x import y``).

    Returns (binding, file it was looked up in, reason when not found).
    """
    for rel in module_file_candidates(module):
        text = read_text(rel)
        if text is None:
            continue
        b = find_binding(text, qual, rel)
        if b is not None:
            return b, rel, ""
        head, _, rest = qual.partition(".")
        src = imported_from(text, head, module, rel.endswith("__init__.py"))
        if src is not None and hops < 8:
            target = src[1] + ("." + rest if rest else "")
            return resolve_binding(src[0], target, read_text, hops + 1)
        if rest and hops < 8:  # an inherited attribute: look in the base classes
            for base in _class_bases(text, qual.rsplit(".", 1)[0]):
                found = resolve_binding(module, f"{base}.{qual.rsplit('.', 1)[1]}", read_text, hops + 1)
                if found[0] is not None:
                    return found
        return None, rel, f"{qual} not found in {rel}"
    return None, None, f"module {module} not found in the tree"


def check_binding(redit, read_text) -> tuple[str, str, Binding | None]:
    """Classify a runtime edit statically: (verdict value, reason, binding).

    ``read_text(relpath) -> str | None`` reads the tree. Verdicts are the
    shared vocabulary: ``applies`` (target found and matches), ``drifted``
    (signature or source hash differ, or the target is gone), ``file_missing``.
    """
    module, qual = redit.target.split(":", 1)
    b, rel, why = resolve_binding(module, qual, read_text)
    if b is None:
        return ("file_missing" if rel is None else "drifted"), why, None
    if redit.signature is not None and b.signature != redit.signature:
        return "drifted", f"signature of {redit.target} is {b.signature}, the patch declares {redit.signature}", b
    if redit.source_sha256 is not None and b.source_sha256 != redit.source_sha256:
        return "drifted", (f"source of {redit.target} changed (sha256 {b.source_sha256[:12]}, "
                           f"patch expects {redit.source_sha256[:12]})"), b
    return "applies", "", b
