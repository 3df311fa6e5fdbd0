"""`farm`: the one command tree (Click), and the one place that turns failures into exit codes.

Every subcommand is defined once (base: the root and its global options; services, jobs, data:
the commands), with its options typed and range-checked where they are
parsed (numbers finite, counts >= 1, ports 1-65535). The global options (--config,
--redis-url, --namespace, --log-level, --debug, --version) are read once and passed down as a
typed Settings object; nothing rebuilds argv. Each command is a thin function that calls into
the layer that does the work (farm, workers, producer, trainer), which tests call directly too.

Expected failures end in one line, `farm: <what went wrong and what to do>`, and an exit code
of its kind (farm.errors): 2 usage or configuration, 3 Redis unavailable, 4 Redis refused
the credentials, 5 unknown agent (or, for `farm train`, an agent with no live worker), 6 no
such run, 1 anything else, 130 interrupted (143: `farm train` stopped by SIGTERM). `--debug`
shows the traceback. A Ctrl-C while a command starts (its modules load, Redis or a model server
starts) ends in `farm: interrupted` and 130 too: the command tree loads inside the boundary.
Shell completion: `farm completion bash` (or zsh, fish) prints the script.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from farm.cli.base import cli

__all__ = ["cli", "main"]

EXIT_INTERRUPTED = 130  # farm.errors.EXIT_INTERRUPTED, here so that a Ctrl-C before it loads still has it


def __getattr__(name: str) -> Any:
    if name == "cli":
        return _commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _commands() -> Any:
    """The command tree, loaded on first use (inside main's boundary: a Ctrl-C while it loads is an
    interrupt like any other, not a traceback)."""
    # isort: off
    from farm.cli.base import cli  # the root group, which the modules below register their commands on
    from farm.cli import services, jobs, data, dead, cancel, reverify, sandbox  # noqa: F401
    # isort: on

    return cli


# -- the one error boundary -------------------------------------------------------------------


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        return _run(args, debug)
    except KeyboardInterrupt:  # while the commands loaded, or between two of _run's handlers
        return _interrupted(debug)


def _interrupted(debug: bool) -> int:
    """Ctrl-C (SIGINT) at any moment of a command, its start-up included: one line, exit 130."""
    if debug:
        traceback.print_exc()
    if "FARM_WORKER_SLOT" not in os.environ:  # a pool's worker: its pool, told the same, says it once
        print("farm: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def _run(args: list[str], debug: bool) -> int:
    import click

    from farm.errors import EXIT_CONFIG, EXIT_CRASH, FarmError

    cli = _commands()
    try:
        result = cli.main(args=args, prog_name="farm", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:  # Click's own word for a Ctrl-C inside a command
        return _interrupted(debug)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # set on usage errors only
        where = ctx.command_path if ctx is not None else "farm"
        hint = f" (see `{where} --help`)" if isinstance(exc, click.UsageError) else ""
        print(f"{where}: {_one_line(exc.format_message())}{hint}", file=sys.stderr)
        return EXIT_CONFIG if exc.exit_code in (1, 2) else exc.exit_code
    except KeyboardInterrupt:
        return _interrupted(debug)
    except FarmError as exc:
        if debug:
            traceback.print_exc()
        print(f"farm: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        if debug:
            traceback.print_exc()
        print(
            f"farm: the Python package {exc.name!r} is not installed: install the extra that needs it "
            "(pip install -e '.[policy]', '.[envs]', '.[train]', '.[dashboard]' or '.[parquet]')",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except (OSError, UnicodeError, ValueError) as exc:
        if debug:
            traceback.print_exc()
        print(f"farm: {_one_line(_describe(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, the traceback on --debug
        if debug:
            traceback.print_exc()
        print(
            f"farm: internal error: {type(exc).__name__}: {_one_line(exc)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_CRASH


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, OSError) and exc.filename:
        what = {
            IsADirectoryError: "is a directory",
            NotADirectoryError: "is not a directory",
            FileNotFoundError: "does not exist",
            PermissionError: "permission denied",
        }.get(type(exc), exc.strerror)
        return f"{exc.filename}: {what}"
    if isinstance(exc, OSError) and exc.errno == 98:
        return f"address already in use: {exc.strerror}; pick another port"
    return str(exc)
