"""``python -m daskrl``: the ``daskrl`` command line (see :mod:`daskrl.cli`)."""

import sys

from daskrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
