"""Markdown and terminal rendering of a :class:`~.configmodels.ConfigDrift`."""

from __future__ import annotations

from .configmodels import ConfigDrift, DependencyChange, EnvChange

_MAX_CELL = 140


def _short(text: str | None, limit: int = _MAX_CELL) -> str:
    if text is None:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _md_code(text: str | None) -> str:
    if text is None:
        return "-"
    t = _short(text).replace("|", "\\|").replace("`", "'")
    return f"`{t}`" if t else "`''`"


def _dep_label(c: DependencyChange) -> str:
    label = c.name
    if c.group:
        label += f" [{c.group}]"
    return label


def _dep_spec(spec: str | None, extras: list[str], marker: str | None) -> str | None:
    if spec is None:
        return None
    text = (f"[{','.join(extras)}]" if extras else "") + (spec or "(any)")
    if marker:
        text += f"; {marker}"
    return text


def _env_old_new(c: EnvChange) -> tuple[str | None, str | None]:
    if c.change == "changed" and not c.default_changed:
        if c.old_expr == c.new_expr:
            return c.old_annotated, c.new_annotated
        return c.old_expr, c.new_expr
    old = c.old_default if c.old_default is not None else c.old_annotated
    new = c.new_default if c.new_default is not None else c.new_annotated
    if c.change == "added":
        return None, new if new is not None else c.new_expr
    if c.change == "removed":
        return old if old is not None else c.old_expr, None
    if c.old_default == c.new_default:  # only the TYPE_CHECKING default moved
        return c.old_annotated, c.new_annotated
    return old, new


def _rows(drift: ConfigDrift):
    """(section, rows) with rows of (attention, change, name, old, new, note), shared by both renderers."""
    deps = [(c.attention, c.change, _dep_label(c), _dep_spec(c.old, c.old_extras, c.old_marker),
             _dep_spec(c.new, c.new_extras, c.new_marker), c.detail)
            for c in _ordered(drift.dependencies)]
    env = []
    for c in _ordered(drift.env):
        old, new = _env_old_new(c)
        note = ""
        if c.change == "changed":
            note = ("default" if c.default_changed else
                    "expression only" if c.old_expr != c.new_expr else "TYPE_CHECKING default only")
        env.append((c.attention, c.change, c.name, old, new, note))
    args = []
    for c in _ordered(drift.engine_args):
        note = ""
        if c.change == "changed" and c.new_expr != c.old_expr and c.new_expr is not None:
            note = f"was {_short(c.old_expr, 60)}" if c.old_expr != c.old else ""
        if not c.resolved:
            note = (note + "; " if note else "") + "unresolved expression"
        args.append((c.attention, c.change, c.name, c.old, c.new, note))
    return [("Dependencies", drift.dependencies, deps), ("Environment defaults", drift.env, env),
            ("Engine arguments", drift.engine_args, args)]


def _ordered(section):
    items = [*section.changed, *section.added, *section.removed]
    # watched first; then the stable per-list order (changed, added, removed)
    return sorted(items, key=lambda c: not c.attention)


def render_markdown(drift: ConfigDrift) -> str:
    out = [f"## Configuration drift: {drift.pin or 'pin'} -> {drift.candidate or 'candidate'}", ""]
    if drift.watch_source:
        out.append(f"Watch list: `{drift.watch_source}`. "
                   f"**{drift.attention_count} watched item(s) changed.**" if drift.has_attention
                   else f"Watch list: `{drift.watch_source}`. No watched item changed.")
        out.append("")
    for title, section, rows in _rows(drift):
        counts = f"{len(section.changed)} changed, {len(section.added)} added, {len(section.removed)} removed"
        out.append(f"### {title} ({counts if section.available else 'not available'})")
        out.append("")
        for note in section.notes:
            out.append(f"> {note}")
        if section.notes:
            out.append("")
        if rows:
            out.append("| | change | name | old | new | note |")
            out.append("|---|---|---|---|---|---|")
            for att, change, name, old, new, note in rows:
                flag = "**!**" if att else ""
                out.append(f"| {flag} | {change} | `{name}` | {_md_code(old)} | {_md_code(new)} | "
                           f"{_short(note).replace('|', chr(92) + '|')} |")
            out.append("")
        elif section.available:
            out.append("No changes.")
            out.append("")
    if drift.runtime_targets:
        out.append("### Runtime-patch targets")
        out.append("")
        out.append("| patch | edit | target | status | pin | candidate | note |")
        out.append("|---|---|---|---|---|---|---|")
        for r in sorted(drift.runtime_targets, key=lambda r: (not r.broken, r.patch, r.edit)):
            status = f"**{r.status}**" if r.broken else r.status
            out.append(f"| {r.patch} | {r.edit} | `{r.target}` | {status} | {_md_code(r.pin_signature)} | "
                       f"{_md_code(r.candidate_signature)} | {_short(r.note).replace('|', chr(92) + '|')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_terminal(drift: ConfigDrift, console=None) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..render import make_console

    console = console or make_console()
    head = f"Configuration drift {drift.pin or 'pin'} -> {drift.candidate or 'candidate'}"
    if drift.watch_source:
        head += f"  (watch: {drift.watch_source}; {drift.attention_count} watched changed)"
    console.rule(head)
    for title, section, rows in _rows(drift):
        if not section.available:
            console.print(f"[bold]{title}[/bold]: not available")
            for note in section.notes:
                console.print(f"  [dim]{note}[/dim]", markup=True, highlight=False)
            continue
        table = Table(title=f"{title}: {len(section.changed)} changed, {len(section.added)} added, "
                            f"{len(section.removed)} removed", title_justify="left", show_lines=False)
        for col in ("!", "change", "name", "old", "new", "note"):
            table.add_column(col, overflow="fold")
        for att, change, name, old, new, note in rows:
            style = "bold yellow" if att else ("red" if change == "removed" else None)
            table.add_row("!" if att else "", change, Text(name), Text(_short(old)), Text(_short(new)),
                          Text(note), style=style)
        if rows:
            console.print(table)
        else:
            console.print(f"[bold]{title}[/bold]: no changes")
        for note in section.notes:
            console.print(Text(f"  {note}", style="dim"))
    if drift.runtime_targets:
        table = Table(title="Runtime-patch targets", title_justify="left")
        for col in ("patch", "edit", "target", "status", "note"):
            table.add_column(col, overflow="fold")
        for r in sorted(drift.runtime_targets, key=lambda r: (not r.broken, r.patch, r.edit)):
            table.add_row(r.patch, r.edit, Text(r.target), r.status, Text(r.note),
                          style="bold red" if r.broken else None)
        console.print(table)
