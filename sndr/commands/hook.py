"""``python -m sndr hook install|uninstall``: the in-memory import hook (.pth) of an environment."""

from __future__ import annotations

import argparse

from . import path_text

HELP = "Install or remove the in-memory import hook (.pth) of an environment."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("action", choices=["install", "uninstall"])
    ap.add_argument("--site", type=path_text, help="site-packages directory to write the .pth into "
                                   "(default: the directory that holds vllm/ for --python)")
    ap.add_argument("--python", type=path_text, help="interpreter of the target environment (default: this one)")


def run(args: argparse.Namespace) -> int:
    from ..cli import run as boundary

    def body() -> int:
        from ..startup.hook import run_hook  # inside the boundary: an import failure is its exit 3 and line

        return run_hook(args.action, args.site, args.python)

    return boundary("sndr hook", body,
                    on_interrupt=lambda: "the .pth is either written whole or not at all; run `python -m sndr hook "
                                         "install` or `uninstall` again")
