"""The ``tierax`` command line: one short function per verb over the library.

Bad input exits 2 with one line naming the problem and the fix (``--debug``
shows the traceback too, and still exits 2); an interrupted run exits 130; a closed output pipe
ends quietly.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from tierax import records
from tierax.cli.common import resolve_model
from tierax.cli.parsers import build_parser
from tierax.errors import TieraxError

__all__ = ["build_parser", "main", "resolve_model"]


def _parse(argv: Sequence[str] | None):
    """The parsed command line; ``tierax train``'s KEY=VALUE overrides may also follow its flags
    (``train CONFIG --resume steps=25``), appended in order."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "verb", None) == "train":
        if all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
            return args
    if extra:
        parser.parse_args(argv)  # argparse's own "unrecognized arguments" message, exit 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        with records.invoked_with(sys.argv[1:] if argv is None else argv):
            return args.func(args)
    except TieraxError as e:
        if args.debug:  # the traceback too, and still the exit code of bad input
            traceback.print_exc()
        print(f"tierax {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"tierax {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's exit flush from
        # failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if args.debug:
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(
            f"tierax {args.verb}: error: {e.strerror or e}{where}; rerun with --debug for the "
            f"traceback",
            file=sys.stderr,
        )
        return 1
