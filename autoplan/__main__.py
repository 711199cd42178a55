"""``python -m autoplan``: the same as the ``autoplan`` command."""

import sys


def run() -> int:
    """The command, with Ctrl-C during start-up (importing torch takes seconds) handled too."""
    try:
        from autoplan.cli import main

        return main()
    except KeyboardInterrupt:
        print("autoplan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(run())
