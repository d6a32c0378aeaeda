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

from tierax.cli.common import resolve_model
from tierax.cli.parsers import build_parser
from tierax.errors import TieraxError

__all__ = ["build_parser", "main", "resolve_model"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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
