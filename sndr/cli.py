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

It also owns the one output writer, :func:`write_output` (with
:func:`check_output` to refuse a bad path before the work): ``-`` is stdout; a
new path, or an existing regular file owned by the caller, is replaced
atomically (:func:`sndr.fsio.atomic_write`: a temp file beside it, then a
rename that never follows a final symlink); anything else (a symlink, FIFO,
device, socket, directory, or another user's file) is refused with exit 2
(``output_refused``), naming the path, and left untouched. An output named as a
directory to write into (``manifest build --out DIR``, ``vendor --out DIR``,
``import --to DIR``) is held to the same rule: ``DIR`` is the path the user named,
so a symlink there is refused as it is for a file (``check_output(DIR,
directory=True)``), and each file is written through ``DIR`` opened without
following a link (``write_output(..., named_dir=True)``); several files of one
command go through :func:`write_outputs`, which checks every one before it writes
any. The directories above the named path are resolved as the system resolves
them, for every output alike.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import argparse
    from types import FrameType


#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: The running command's ``--json`` (:func:`expect_json`), and whether its JSON document is on stdout yet.
_json_dest: str | None = None
_json_written = False
#: Whether :func:`expect_json` has been told (the command line is parsed); before that, ``--json -`` is read from
#: ``sys.argv`` as :func:`parse_args` reads it for a usage error.
_json_known = False


def expect_json(dest: str | None) -> None:
    """Tell :func:`run` the command's ``--json`` (``sndr.__main__`` does, before each command): under ``-``,
    an error that ends the command still leaves one JSON document on stdout (``ok`` false, its exit status
    and problems), unless the command already wrote its own there."""
    global _json_dest, _json_written, _json_known
    _json_dest, _json_written, _json_known = dest, False, True


def _wants_stdout_json(argv: list[str]) -> bool:
    """``--json -`` (or ``--json=-``) on a command line, before (or without) argparse."""
    return any(a == "--json=-" or (a == "--json" and argv[i + 1:i + 2] == ["-"]) for i, a in enumerate(argv))


def _interrupted_doc(message: str) -> bytes:
    """The one JSON document of a command stopped by Ctrl-C while starting (``interrupted``, exit 130), laid out
    as :func:`_json_error` writes it; by hand, as ``json`` is not imported yet and importing it before the
    handler is in would widen the window where a Ctrl-C ends the process inside sndr's code (``message``:
    plain ASCII, no quotes). ``tests/core/test_cli_outcomes.py`` holds it equal to the ``json.dumps`` form."""
    return (f'{{\n  "ok": false,\n  "exit_code": {EXIT_INTERRUPTED},\n  "problems": [\n    {{\n      "code": '
            f'"interrupted",\n      "message": "{message}"\n    }}\n  ]\n}}\n').encode()


def _json_error(exit_code: int, problems: list[dict[str, object]]) -> None:
    """The one document of a command that an error ended, where its ``--json`` goes (stdout or FILE), unless
    the command wrote its own there, or FILE is the very output refused (``output_refused``)."""
    if _json_dest is None or _json_written or any(p.get("code") == "output_refused" for p in problems):
        return
    import json

    doc = json.dumps({"ok": False, "exit_code": exit_code, "problems": problems}, indent=2) + "\n"
    if _json_dest == "-":
        write_output("-", doc)
        return
    try:  # a stale report of an earlier run must not stay there as if it were this run's
        write_output(_json_dest, doc, "--json")
    except Exception as exc:  # noqa: BLE001 - the error itself is already on stderr; say this one too
        print(f"sndr: --json {_json_dest}: the error document could not be written either ({exc})", file=sys.stderr)


def catch_early_interrupt(prog: str) -> None:
    """Ctrl-C while a command is still importing: one line and exit 130, never an import traceback.

    Called first thing by ``python -m sndr ...`` entry modules, before their heavy
    imports; nothing has been written yet, so exiting at once is safe. :func:`run`
    puts Python's own handler back, and the body's interrupt goes through it. Under
    ``--json -`` (the parsed one once :func:`expect_json` was told, else read from
    ``sys.argv``) the interrupt also leaves the one JSON document on stdout
    (``interrupted``, exit 130), as :func:`run` does for the rest of the command.
    """
    import signal

    message = "interrupted while starting; nothing was changed"
    doc = _interrupted_doc(message)  # built now: the handler only writes

    def early(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not write a second document
            wants = _json_dest == "-" if _json_known else _wants_stdout_json(sys.argv[1:])
            if wants and not _json_written:
                os.write(1, doc)
            os.write(2, f"{prog}: {message}\n".encode())
        finally:
            os._exit(EXIT_INTERRUPTED)

    try:
        signal.signal(signal.SIGINT, early)
    except (ValueError, OSError):  # not the main thread
        pass


#: Set by :func:`_noting_interrupt` when a SIGINT reaches the body. An extension that catches the
#: KeyboardInterrupt and raises its own error (pydantic-core building a model's validator during a lazy
#: import reports ``SchemaError: ... KeyboardInterrupt``) would otherwise turn Ctrl-C into "internal error"
#: (exit 3) with a traceback; :func:`_run` reads this and reports the interrupt instead.
_sigint_seen = False


def _noting_interrupt(signum: int, frame: FrameType | None) -> None:
    """Python's own SIGINT behaviour (raise KeyboardInterrupt), remembering that it happened."""
    import signal

    global _sigint_seen
    _sigint_seen = True
    signal.default_int_handler(signum, frame)


def _restore_interrupt() -> None:
    """Hand SIGINT from :func:`catch_early_interrupt`'s handler (or Python's) to :func:`_noting_interrupt`."""
    import signal

    global _sigint_seen
    _sigint_seen = False
    try:
        handler = signal.getsignal(signal.SIGINT)
        if handler is signal.default_int_handler or getattr(handler, "__name__", "") == "early":
            signal.signal(signal.SIGINT, _noting_interrupt)
    except (ValueError, OSError):  # not the main thread
        pass


def _output_problem(dest: str, directory: bool = False) -> str | None:
    """Why ``dest`` cannot be an output file (None: a new path, or a regular file of ours); with ``directory``,
    why it cannot be the directory an output file is written into (None: a new path, or a directory that
    takes a new file)."""
    import stat

    from .fsio import kind_of

    inside = os.path.join(dest, "output")  # a file in the directory ``dest``: where the output will go
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return _output_dir_problem(inside if directory else dest)
    except NotADirectoryError:
        return "a directory on its path is not a directory"
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            to = f" to {os.readlink(dest)}"
        except OSError:
            to = ""
        return f"it is a symlink{to}, which sndr does not follow for an output"
    if stat.S_ISDIR(st.st_mode):
        return _output_dir_problem(inside) if directory else "it is a directory"
    if directory:
        return f"it is {kind_of(st.st_mode)}, not a directory (the output file is written into it)"
    if not stat.S_ISREG(st.st_mode):
        return f"it is {kind_of(st.st_mode)}, not a regular file (sndr replaces an output file atomically)"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    return _output_dir_problem(dest)


def _output_dir_problem(dest: str) -> str | None:
    """Why the directory that will hold ``dest`` (its nearest existing ancestor, as :func:`write_output`
    creates the rest) takes no new file: a read-only filesystem, or no write permission. Checked with the
    output, before any work, so that a command never does its work and then fails on its report."""
    d = os.path.dirname(os.path.abspath(dest))
    while not os.path.lexists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        return f"{d} on its path is not a directory"
    if os.access(d, os.W_OK | os.X_OK):
        if d != os.path.dirname(os.path.abspath(dest)):
            return None  # write_output creates the missing directories; os.access is what can be known now
        # Permission bits are not the whole answer (root under /proc, a filesystem that refuses new files):
        # create and remove a file where the report's temporary file will go, before any work is done.
        import tempfile

        try:
            fd, probe = tempfile.mkstemp(prefix=".sndr-output-probe-", dir=d)
        except OSError as exc:
            return f"its directory {d} takes no new file ({exc.strerror or exc})"
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass
        return None
    try:
        readonly = bool(os.statvfs(d).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    return f"its directory {d} is on a read-only filesystem" if readonly else \
        f"its directory {d} is not writable by this user"


def check_output(dest: str | os.PathLike[str], flag: str = "output", *, directory: bool = False) -> None:
    """Refuse (``output_refused``, exit 2) an output path :func:`write_output` would not write.

    With ``directory``, ``dest`` names the directory the output file goes into (``manifest build --out DIR``,
    whose file name is known only after the work): a new path, or a directory (never a symlink to one) that
    takes a new file; :func:`write_output` with ``named_dir`` then writes there."""
    dest = os.fspath(dest)
    if dest == "-":
        return
    why = _output_problem(dest, directory)
    if why is not None:
        from .errors import bad_input

        raise bad_input("output_refused", f"{flag}: {why}; nothing was written there", file=dest,
                        hint=("give a new path, or a directory you can write that is not a symlink (the directory "
                              "the link points to, if that is where the output belongs)" if directory
                              else "give a new path or a regular file you own, or - for stdout"))


def _open_named_dir(path: str, flag: str) -> int:
    """The fd of the directory ``path``, opened without following a final symlink (``output_refused`` if one
    was put there since :func:`check_output`)."""
    import errno

    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        check_output(path, flag, directory=True)  # names what is there now
        raise


def write_output(dest: str | os.PathLike[str], text: str | bytes, flag: str = "output", *,
                 mode: int | None = None, named_dir: bool = False) -> None:
    """The one output writer of every command: ``-`` is stdout, else an atomic replace (see the module doc).

    ``named_dir``: the directory holding ``dest`` is the path the user named (``--out DIR``), an output path
    as well: refused when it is a symlink (or not a directory), and ``dest`` is written through it opened
    with ``O_NOFOLLOW``, so that a link put there after the check is never followed either."""
    global _json_written
    dest = os.fspath(dest)
    if dest == "-":
        _json_written = True
        if isinstance(text, str):
            sys.stdout.write(text)
        else:
            sys.stdout.flush()
            sys.stdout.buffer.write(text)
        sys.stdout.flush()
        return
    data = text.encode("utf-8") if isinstance(text, str) else text
    parent = os.path.dirname(os.path.abspath(dest))
    if named_dir:
        check_output(parent, flag, directory=True)  # first: the file check below would look through a link
    check_output(dest, flag)
    from . import fsio

    os.makedirs(parent, exist_ok=True)
    if mode is None:
        try:
            import stat

            mode = stat.S_IMODE(os.lstat(dest).st_mode)
        except FileNotFoundError:
            umask = os.umask(0o022)
            os.umask(umask)
            mode = 0o666 & ~umask
    # atomic_write's rename replaces the entry itself: a symlink swapped in after the check is
    # replaced, never followed, and in a sticky directory another user's entry cannot be replaced.
    if named_dir:
        fd = _open_named_dir(parent, flag)
        try:
            fsio.atomic_write(os.path.basename(dest), data, mode, dir_fd=fd)
        finally:
            os.close(fd)
    else:
        fsio.atomic_write(os.path.abspath(dest), data, mode)
    if dest == _json_dest:
        _json_written = True  # the command's own document (or its error document) is there


def write_outputs(files: Sequence[tuple[str | os.PathLike[str], str | bytes]], flag: str = "output", *,
                  named_dir: bool = False) -> None:
    """Several output files of one command (``import --to DIR``: a patch file per member and the report):
    every path is checked first (:func:`check_output`, and with ``named_dir`` each one's directory, the path the
    user named), so that a refused one leaves nothing written; then each is written by :func:`write_output`."""
    for dest, _ in files:
        if named_dir:
            check_output(os.path.dirname(os.path.abspath(dest)), flag, directory=True)
        check_output(dest, flag)
    for dest, text in files:
        write_output(dest, text, flag, named_dir=named_dir)


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``ap.parse_args(argv)``; on a usage error with ``--json -`` (or ``--json=-``) one JSON document
    still goes to stdout (``ok`` false, ``exit_code`` 2, code ``usage`` with argparse's message), so its
    reader never gets an empty stream. argparse's own message on stderr and its exit 2 are unchanged."""
    import argparse

    global _json_written
    argv = sys.argv[1:] if argv is None else list(argv)
    said: list[str] = []

    def parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        out = [p]
        for action in p._actions:  # subcommands report their own usage errors
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out += parsers(sub)
        return out

    def recording(p: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
        error = p.error

        def record(message: str) -> NoReturn:
            said.append(message)
            error(message)

        return record

    every = parsers(ap)
    for p in every:
        p.error = recording(p)  # type: ignore[method-assign,assignment]
    try:
        return ap.parse_args(argv)
    except SystemExit:
        if said and _wants_stdout_json(argv):
            import json

            from .errors import EXIT_BAD_INPUT

            _json_written = True  # an interrupt from here on adds no second document
            sys.stdout.write(json.dumps({"ok": False, "exit_code": EXIT_BAD_INPUT, "problems": [
                {"code": "usage", "message": said[0], "key": "argv"}]}, indent=2) + "\n")
            sys.stdout.flush()
        raise
    finally:
        for p in every:
            p.__dict__.pop("error", None)


def pause_at(point: str) -> None:
    """Test-only: with ``SNDR_TEST_PAUSE=<point>`` (:data:`sndr.env.PAUSE`), say so on stderr and wait up to
    60 s at this point of the command's start-up, so that a test can send a real SIGINT there
    (``tests/core/test_cli_outcomes.py``). Unset (always, outside tests): returns at once."""
    from . import env

    if env.pause_point() != point:
        return
    import time

    os.write(2, f"sndr: test pause at {point} ({env.PAUSE})\n".encode())
    time.sleep(60)


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
    try:
        return _run(prog, body, on_interrupt)
    finally:
        expect_json(None)  # the command's --json ends with it: a later in-process run never inherits it


def _report_interrupt(prog: str, on_interrupt: Callable[[], str] | None) -> int:
    """Ctrl-C stopped the body: one line (with ``on_interrupt``'s state of the tree), the JSON document, 130."""
    detail = ""
    if on_interrupt is not None:
        try:
            detail = on_interrupt()
        except Exception:  # noqa: BLE001 - the interrupt message must always print
            detail = ""
    say(prog, "interrupted" + (f"; {detail}" if detail else ""))
    _json_error(EXIT_INTERRUPTED, [{"code": "interrupted", "message": "interrupted" + (f"; {detail}" if detail
                                                                                     else "")}])
    return EXIT_INTERRUPTED


def _run(prog: str, body: Callable[[], int], on_interrupt: Callable[[], str] | None) -> int:
    # imported here, not at module level: `--help` and a usage error never need them (sndr.errors pulls in
    # dataclasses and inspect, about a fifth of a command's --help)
    from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, SndrError, registered_exit
    from .fsio import FileProblem

    try:
        _restore_interrupt()
        code = body()
        return EXIT_BAD_INPUT if code is None else int(code)
    except SndrError as exc:
        for p in exc.problems:
            print(f"{prog}: {p.render()}", file=sys.stderr)
        _json_error(exc.exit_code, [p.to_json() for p in exc.problems])
        return exc.exit_code
    except FileProblem as exc:
        where = f"{exc.path}:{exc.line}" if exc.line else exc.path
        say(prog, f"{where}: {exc.message} ({exc.code})")
        code = registered_exit(exc.code, EXIT_BAD_INPUT)
        _json_error(code, [{k: v for k, v in (("code", exc.code), ("message", exc.message), ("file", exc.path),
                                               ("line", exc.line)) if v is not None}])
        return code
    except KeyboardInterrupt:
        return _report_interrupt(prog, on_interrupt)
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
        _json_error(EXIT_BAD_INPUT, [{"code": "too_deep", "message": "input nested too deeply to process"}])
        return EXIT_BAD_INPUT
    except OSError as exc:
        name = exc.filename or ""
        where = f"{name}: " if name else ""
        say(prog, f"{where}{exc.strerror or exc} (os_error, errno {exc.errno})")
        _json_error(EXIT_BAD_INPUT, [{"code": "os_error", "message": str(exc.strerror or exc),
                                      **({"file": str(name)} if name else {})}])
        return EXIT_BAD_INPUT
    except Exception:  # noqa: BLE001 - the last-resort boundary: a traceback and exit 3, never a silent exit
        if _sigint_seen:  # Ctrl-C, turned into another error by an extension that caught it: still Ctrl-C
            return _report_interrupt(prog, on_interrupt)
        import traceback

        traceback.print_exc()
        say(prog, f"internal error (exit {EXIT_INTERNAL}); please report it with the traceback above")
        _json_error(EXIT_INTERNAL, [{"code": "internal", "message": "internal error; the traceback is on stderr"}])
        return EXIT_INTERNAL
    except BaseException as exc:
        # A Rust extension's panic is a BaseException (pyo3's PanicException): a Ctrl-C that landed while
        # pydantic-core imported `datetime` made pyo3 panic ("failed to import datetime C API") and the process
        # die with a traceback, exit 1 (seen under load, stop 44). After a SIGINT it is the interrupt.
        if _sigint_seen and not isinstance(exc, (SystemExit, GeneratorExit)):
            return _report_interrupt(prog, on_interrupt)
        raise
