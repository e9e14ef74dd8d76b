"""The preflight's "performance plugins" section: did the upstream code a plugin replaces or races change?

A plugin patch (``kind = "plugin"``) is worth shipping only while it beats what
vLLM runs; its benchmark measured it against the pin's code. For each plugin
this compares, pin against candidate (pristine texts, statically):

* **bound**: each ``[[runtime]]`` target as the layer module binds it,
  followed through re-exports to the function (or method) that defines it,
  and, for a function imported from another file, that whole file (the
  kernel file: its Triton/CUDA kernels live beside the entry);
* **callee**: for a method target, the same class's methods it calls
  (``self.x(...)``): the path a wrapper replaces (e.g. PK0002's
  ``forward`` -> ``_prefill_attention``), and the Triton kernel files those
  methods call (kernels of other platforms, ROCm's aiter/FlyDSL and XPU, are
  no competitors on the CUDA GPUs the plugins cover);
* **caller**: every function or method of the layer module whose body names a
  function target (the code that decides when vLLM calls it);
* **gained** / **lost**: kernels the layer module imports on one side only
  (a name whose defining file holds ``@triton.jit``: "Triton"; one from
  ``_custom_ops``: "CUDA op"): a new competitor, or a gone one.

A changed competitor (a bound function, its kernel file, a kernel the wrapped
methods call, a gained or lost kernel) gives the verdict ``re-measure``: the
plugin's benchmark must be run against the candidate's kernels (``--vllm X``)
before ``pin advance`` (:mod:`sndr.upstream.pin`, ``--perf-ref``), or the
refusal waived with a reason the pin records. Changes only in the code around
them (callers, callees) give ``review``: named, not gating. Each change is
named with its file and the number of lines it changed (difflib,
``+added/-removed``).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable

from ..binding import imported_from, module_file_candidates, resolve_binding
from ..load import PatchSet
from .models import PerfChange, PerfKind, PerfPlugin

Reader = Callable[[str], "str | None"]
#: Changes to what the plugin's benchmark measured against: vLLM's own kernels. A change only around
#: them (callers, callees of a wrapped method) is ``review``: named, but no new measurement is required.
REMEASURE = ("bound", "kernel_file", "gained", "lost")


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _node(tree: ast.Module | None, qualname: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in qualname.split("."):
        if node is None:
            return None
        node = next((c for c in getattr(node, "body", [])
                     if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and c.name == part), None)
    return node


def _segment(text: str | None, qualname: str) -> str | None:
    node = _node(_parse(text), qualname)
    return None if node is None or text is None else ast.get_source_segment(text, node)


def line_delta(old: str | None, new: str | None) -> tuple[int, int]:
    """(lines added, lines removed) from ``old`` to ``new`` (difflib, no context)."""
    a = (old or "").splitlines()
    b = (new or "").splitlines()
    plus = minus = 0
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            plus += 1
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
    return plus, minus


def _module_file(module: str, read: Reader) -> str | None:
    return next((rel for rel in module_file_candidates(module) if read(rel) is not None), None)


def _functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualname, node) of every module-level function and every method of a module-level class."""
    out: list[tuple[str, ast.AST]] = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((n.name, n))
        elif isinstance(n, ast.ClassDef):
            out += [(f"{n.name}.{m.name}", m) for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _self_calls(node: ast.AST) -> set[str]:
    return {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}


def _imports(tree: ast.Module | None) -> set[str]:
    """Names bound by module-level ``from x import y`` (and inside module-level try/if blocks)."""
    out: set[str] = set()
    if tree is None:
        return out
    stack = list(tree.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.ImportFrom):
            out.update(a.asname or a.name for a in n.names)
        elif isinstance(n, (ast.Try, ast.If)):
            stack += [*n.body, *n.orelse, *getattr(n, "handlers", []), *getattr(n, "finalbody", [])]
        elif isinstance(n, ast.ExceptHandler):
            stack += n.body
    return out


def _other_platform(rel: str) -> bool:
    """A kernel file of another platform (ROCm's aiter/FlyDSL, XPU): no competitor on the CUDA GPUs the
    plugins cover."""
    low = rel.lower()
    return any(k in low for k in ("rocm", "aiter", "flydsl", "xpu", "hip"))


def _kernel_kind(module: str, name: str, text: str | None, read: Reader) -> tuple[str, str] | None:
    """("Triton" | "CUDA op", defining file) when ``name`` imported by the layer is a kernel entry."""
    src = imported_from(text or "", name, module, False)
    if src is None:
        return None
    binding, rel, _ = resolve_binding(src[0], src[1], read)
    if binding is None or binding.signature is None:  # a class or a constant: not a kernel entry
        return None
    rel = binding.file
    if _other_platform(rel):
        return None
    body = read(rel) or ""
    if "triton.jit" in body:
        return "Triton", rel
    if rel.endswith("_custom_ops.py"):
        return "CUDA op", rel
    return None


def _change(kind: PerfKind, file: str, name: str, old: str | None, new: str | None) -> PerfChange | None:
    if old == new:
        return None
    if old is None or new is None:
        what = "gone on the candidate" if new is None else "new on the candidate"
        return PerfChange(kind=kind, file=file, name=name, detail=f"{name or file}: {what}")
    plus, minus = line_delta(old, new)
    return PerfChange(kind=kind, file=file, name=name, added=plus, removed=minus,
                      detail=f"{name or file} changed by {plus + minus} lines (+{plus}/-{minus})")


#: The order of a plugin's changes: what the whole layer did first, then kernels, then functions.
_HEADLINE = {"layer_file": 0, "gained": 1, "lost": 1, "kernel_file": 2, "bound": 3, "callee": 4, "caller": 5}


def plugin_entry(patch, pin: Reader, cand: Reader, enabled: bool) -> PerfPlugin:
    """The performance-plugins entry of one plugin patch (see the module docstring)."""
    changes: list[PerfChange] = []
    compared: list[str] = []
    layer_files: set[tuple[str, str]] = set()
    for r in patch.runtime:
        module, _, qual = r.target.partition(":")
        layer = _module_file(module, pin) or _module_file(module, cand)
        if layer is None:
            changes.append(PerfChange(kind="bound", file=module, name=qual, detail=f"module {module} not found"))
            continue
        layer_files.add((module, layer))
        pb, pfile, _ = resolve_binding(module, qual, pin)
        cb, cfile, _ = resolve_binding(module, qual, cand)
        bfile = (pb.file if pb else None) or (cb.file if cb else None) or layer
        bqual = (pb.qualname if pb else None) or (cb.qualname if cb else None) or qual
        old = _segment(pin(pb.file), pb.qualname) if pb else None
        new = _segment(cand(cb.file), cb.qualname) if cb else None
        compared.append(f"{bqual} ({bfile})")
        c = _change("bound", bfile, bqual, old, new)
        if c is not None:
            changes.append(c)
        if "." in qual:  # a method: the same class's methods it calls are the path it replaces or wraps
            cls = bqual.rsplit(".", 1)[0]
            node = _node(_parse(pin(bfile)), bqual) or _node(_parse(cand(bfile)), bqual)
            nodes = [node] if node is not None else []
            for m in sorted(_self_calls(node) if node is not None else ()):
                mq = f"{cls}.{m}"
                po, cn = _segment(pin(bfile), mq), _segment(cand(bfile), mq)
                if po is None and cn is None:
                    continue
                compared.append(f"{mq} ({bfile})")
                c = _change("callee", bfile, mq, po, cn)
                if c is not None:
                    changes.append(c)
                sub = _node(_parse(pin(bfile)), mq)
                if sub is not None:
                    nodes.append(sub)
            # the kernels those methods call: functions imported from other files, compared whole
            kernel_files: set[str] = set()
            for n in nodes:
                for name in sorted(_names_in(n) & _imports(_parse(pin(bfile)))):
                    kb, _, _ = resolve_binding(module, name, pin)
                    if kb is not None and kb.signature is not None and kb.file != bfile \
                            and "triton.jit" in (pin(kb.file) or "") and not _other_platform(kb.file):
                        kernel_files.add(kb.file)
            for kf in sorted(kernel_files):
                compared.append(f"kernel file {kf}")
                c = _change("kernel_file", kf, "", pin(kf), cand(kf))
                if c is not None:
                    changes.append(c)
            continue
        if bfile != layer:  # a function imported into the layer: its whole kernel file
            compared.append(f"kernel file {bfile}")
            c = _change("kernel_file", bfile, "", pin(bfile), cand(bfile))
            if c is not None:
                changes.append(c)
        name = qual.split(".")[-1]
        ptree, ctree = _parse(pin(layer)), _parse(cand(layer))
        callers = {q for t in (ptree, ctree) if t is not None for q, n in _functions(t) if name in _names_in(n)}
        for q in sorted(callers):
            compared.append(f"caller {q} ({layer})")
            c = _change("caller", layer, q, _segment(pin(layer), q), _segment(cand(layer), q))
            if c is not None:
                changes.append(c)
    for module, layer in sorted(layer_files):
        ptext, ctext = pin(layer), cand(layer)
        pnames, cnames = _imports(_parse(ptext)), _imports(_parse(ctext))
        sides: tuple[tuple[PerfKind, set[str], str | None, Reader], ...] = (
            ("gained", cnames - pnames, ctext, cand), ("lost", pnames - cnames, ptext, pin))
        for kind, names, text, read in sides:
            for name in sorted(names):
                k = _kernel_kind(module, name, text, read)
                if k is not None:
                    verb = "gained" if kind == "gained" else "lost"
                    changes.append(PerfChange(kind=kind, file=layer, name=name,
                                              detail=f"{layer} {verb} a {k[0]} kernel {name} ({k[1]})"))
        if any(c.file == layer and c.kind in ("caller", "callee", "bound", "gained", "lost") for c in changes):
            plus, minus = line_delta(ptext, ctext)
            changes.append(PerfChange(kind="layer_file", file=layer, added=plus, removed=minus,
                                      detail=f"{layer} changed by {plus + minus} lines (+{plus}/-{minus})"))
    # One entry per changed piece of code (two bound functions share callers), the layer-level facts
    # (the layer file's size of change, kernels gained or lost) first: the table cell is cut at its width.
    unique = list({(c.file, c.name, c.kind in ("bound", "callee", "caller")): c for c in reversed(changes)}.values())
    changes = sorted(reversed(unique), key=lambda c: _HEADLINE.get(c.kind, len(_HEADLINE)))
    remeasure = any(c.kind in REMEASURE for c in changes)
    return PerfPlugin(id=patch.id, title=patch.title, enabled_by_default=enabled, compared=list(dict.fromkeys(compared)),
                      changes=changes, verdict="re-measure" if remeasure else "review" if changes else "unchanged")


def performance_section(patch_set: PatchSet, pin: Reader, cand: Reader) -> list[PerfPlugin]:
    """One entry per plugin patch of the set (enabled or not: an opt-in plugin is re-measured too)."""
    return [plugin_entry(p, pin, cand, bool(p.default)) for p in patch_set.patches
            if p.kind == "plugin" and p.runtime and p.lifecycle != "retired"]
