import sys

from tierax.cli import main

sys.exit(main())
