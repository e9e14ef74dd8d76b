"""The preflight's summary says what it counts, and terminal tables are not wrapped at 80 columns when
the output is not a terminal (issue 32 LOW)."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.table import Table

from sndr.preflight.render import findings_in_words
from sndr.render import PIPE_WIDTH, make_console


def _config(watched: int, broken: int, source: str | None):
    return SimpleNamespace(attention_count=watched, runtime_broken=[object()] * broken, watch_source=source)


def test_no_watch_list_never_says_watched():
    """Was "2 watched configuration changes" with no watch list configured: they were runtime targets."""
    words = findings_in_words({"drift": 1, "any": 93, "config": 2}, _config(0, 2, None))
    assert "watched" not in words
    assert "2 runtime patch targets changed upstream (signature, source or gone)" in words
    assert "93 other changes (retirements, soft-skips, marker changes, gates; listed above, not review items)" in words
    assert "to review" not in words  # beside "Review (0)" it read as 93 review items
    both = findings_in_words({"config": 3}, _config(2, 1, "sndr.toml"))
    assert both == ("2 watched configuration items changed (watch list sndr.toml); "
                    "1 runtime patch target changed upstream (signature, source or gone)")


def test_tables_do_not_wrap_at_80_columns_in_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()  # not a TTY
    console = make_console(file=out)
    assert console.width == PIPE_WIDTH
    t = Table()
    for name in ("name", "old", "new", "note"):
        t.add_column(name)
    t.add_row("tokenspeed-mla", '==0.2.15; platform_system == "Linux"', '==2.0.3; platform_system == "Linux"',
              "pin 0.2.15 -> 2.0.3")
    console.print(t)
    rows = [ln for ln in out.getvalue().splitlines() if "tokenspeed" in ln or ln.startswith("│   ")]
    assert len(rows) == 1 and 'platform_system == "Linux"' in rows[0], out.getvalue()
