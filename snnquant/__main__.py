"""``python -m snnquant``: the ``snnquant`` command line (:mod:`snnquant.cli`)."""
import sys

from snnquant.cli import main

if __name__ == "__main__":
    sys.exit(main())
