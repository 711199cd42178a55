"""The ``autoplan`` command line: ``main(argv=None)`` returns the exit status, for tests to call."""

from __future__ import annotations

import argparse
import sys

from autoplan.cli import calibrate, export, score, suggest, verify
from autoplan.errors import AutoplanError

# One module per subcommand, each with add_parser(subparsers) and run(args) -> int.
COMMANDS = (suggest, score, verify, calibrate, export)
ERROR_STATUS = 2


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
        return args.run(args)
    except AutoplanError as err:
        if args.debug:
            raise
        message = " ".join(str(err).splitlines())
        print(f"autoplan: error: {message}", file=sys.stderr)
        return ERROR_STATUS
