"""The one CLI boundary: every ``python -m sndr ...`` command runs through :func:`run`.

It owns what a command prints when it stops and with which exit status:

* :class:`~sndr.errors.SndrError` -> each problem on stderr, the error's exit status
  (1 findings, 2 bad input, 3 internal);
* :class:`~sndr.fsio.FileProblem` -> one line naming the file, exit 2;
* ``OSError`` (ENOSPC, EIO, EACCES, ...) -> one line naming the file and the OS error, exit 2;
* ``KeyboardInterrupt`` -> one line saying what state things are in and what to run, exit 130;
* ``BrokenPipeError`` on stdout (``sndr ... | head``) -> quiet exit 0;
* anything else -> the traceback, then one line asking for a report, exit 3.

Human text goes to stderr whenever a command writes JSON to stdout, so that
``--json -`` output is always one JSON document and nothing else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, SndrError, registered_exit

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def catch_early_interrupt(prog: str) -> None:
    """Ctrl-C while a command is still importing: one line and exit 130, never an import traceback.

    Called first thing by ``python -m sndr ...`` entry modules, before their heavy
    imports; nothing has been written yet, so exiting at once is safe. :func:`run`
    puts Python's own handler back, and the body's interrupt goes through it.
    """
    import signal

    def early(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
        try:
            os.write(2, f"{prog}: interrupted while starting; nothing was changed\n".encode())
        finally:
            os._exit(EXIT_INTERRUPTED)

    try:
        signal.signal(signal.SIGINT, early)
    except (ValueError, OSError):  # not the main thread
        pass


def _restore_interrupt() -> None:
    import signal

    try:
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler):
            handler = signal.getsignal(signal.SIGINT)
            if getattr(handler, "__name__", "") in ("early", "_early_interrupt"):
                signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):
        pass


def exit_with(entry: Callable[[], int]) -> None:
    """``sys.exit(entry())`` for a ``python -m sndr...`` process, with the final line and the exit status
    agreeing: once ``entry`` (which ends in :func:`run`) has returned, its last line is printed and its
    status is final, so SIGINT is ignored from then on. A Ctrl-C during the interpreter's shutdown (atexit,
    finalisation) used to turn "ok reverted ... restored" into exit 130 (or a KeyboardInterrupt traceback).
    """
    import signal

    try:
        code = entry()
    except KeyboardInterrupt:  # landed after run() returned, before its status was taken: say so
        code = EXIT_INTERRUPTED
        say("sndr", "interrupted after the command finished; its report above is complete")
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):  # not the main thread
        pass
    sys.exit(code)


def say(prog: str, message: str) -> None:
    """One line on stderr, prefixed with the command's name."""
    print(f"{prog}: {message}", file=sys.stderr)


def run(prog: str, body: Callable[[], int], *, on_interrupt: Callable[[], str] | None = None) -> int:
    """Run ``body()`` and turn every way it can stop into an exit status and at most a few lines.

    ``prog`` names the command in messages (``sndr apply``). ``on_interrupt``
    returns the line printed after Ctrl-C: the state the command left (for
    apply: "the tree is unchanged" or "rolled back") and what to run next.
    """
    from .fsio import FileProblem

    try:
        _restore_interrupt()
        code = body()
        return EXIT_BAD_INPUT if code is None else int(code)
    except SndrError as exc:
        for p in exc.problems:
            print(f"{prog}: {p.render()}", file=sys.stderr)
        return exc.exit_code
    except FileProblem as exc:
        where = f"{exc.path}:{exc.line}" if exc.line else exc.path
        say(prog, f"{where}: {exc.message} ({exc.code})")
        return registered_exit(exc.code, EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        detail = ""
        if on_interrupt is not None:
            try:
                detail = on_interrupt()
            except Exception:  # noqa: BLE001 - the interrupt message must always print
                detail = ""
        say(prog, "interrupted" + (f"; {detail}" if detail else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): not an error. Point stdout at devnull
        # so the interpreter's final flush does not raise again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except RecursionError:
        say(prog, "input nested too deeply to process (recursion limit); nothing was changed (too_deep)")
        return EXIT_BAD_INPUT
    except OSError as exc:
        name = exc.filename or ""
        where = f"{name}: " if name else ""
        say(prog, f"{where}{exc.strerror or exc} (os_error, errno {exc.errno})")
        return EXIT_BAD_INPUT
    except Exception:  # noqa: BLE001 - the last-resort boundary: a traceback and exit 3, never a silent exit
        import traceback

        traceback.print_exc()
        say(prog, f"internal error (exit {EXIT_INTERNAL}); please report it with the traceback above")
        return EXIT_INTERNAL
