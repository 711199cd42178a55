"""The ``autoplan`` command line: ``main(argv=None)`` returns the exit status, for tests to call."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from contextlib import contextmanager

from autoplan.cli import calibrate, diff, explain, export, report, score, show, suggest, verify
from autoplan.errors import AutoplanError

# One module per subcommand, each with add_parser(subparsers) and run(args) -> int.
COMMANDS = (suggest, show, diff, explain, report, score, verify, calibrate, export)
ERROR_STATUS = 2
INTERNAL_STATUS = 1
"""An exception autoplan did not foresee: a bug to report, not a problem with the input."""
INTERRUPTED_STATUS = 130
"""128 + SIGINT, what shells report for a command stopped by Ctrl-C."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoplan", description="Plan how to parallelize a PyTorch model over a device mesh."
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback on errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        subparser = command.add_parser(subparsers)
        # SUPPRESS keeps `autoplan --debug suggest ...` working: the subcommand's default
        # would otherwise overwrite the global flag.
        subparser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        subparser.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors and --help; return instead so tests can call main
        return exit_.code if isinstance(exit_.code, int) else ERROR_STATUS
    try:
        with _quiet_third_parties(args.debug):
            return args.run(args)
    except AutoplanError as err:
        if args.debug:
            raise
        message = " ".join(str(err).splitlines())
        print(f"autoplan: error: {message}", file=sys.stderr)
        return ERROR_STATUS
    except KeyboardInterrupt:
        if args.debug:
            raise
        # Every write is staged and renamed only when whole, and staging removes its temp
        # files on the way out: an interrupted command leaves the files as they were.
        print("autoplan: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    except Exception as err:  # anything else: still one line, the traceback with --debug
        if args.debug:
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(
            f"autoplan: error: {args.command} failed: {type(err).__name__}: {first}; fix: this is autoplan's "
            "fault, not yours: rerun with --debug and report the traceback with the model file",
            file=sys.stderr,
        )
        return INTERNAL_STATUS


@contextmanager
def _quiet_third_parties(debug: bool):
    """For the command's duration: autoplan's warnings as one line each; torch's log
    records and other libraries' warnings only with --debug (the one line of the error
    that follows says what went wrong). The command owns this process, so this changes
    nothing for anyone importing autoplan."""
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning(debug)
        warnings.simplefilter("default")
        if not debug:
            torch_log.setLevel(logging.CRITICAL + 1)
        try:
            yield
        finally:
            torch_log.setLevel(level)


def _show_warning(debug: bool):
    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).splitlines())
        if text.startswith("autoplan: "):
            print(f"autoplan: warning: {text[len('autoplan: '):]}", file=sys.stderr)
        elif debug:
            print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)

    return show
