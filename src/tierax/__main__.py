"""``python -m tierax``: the ``tierax`` command (where the package runs from a source tree, not
installed)."""

import sys

from tierax.cli import main

sys.exit(main())
