"""``python -m resumeloader``: the command line (see `resumeloader.cli`)."""

import sys

from resumeloader.cli import main

if __name__ == "__main__":
    sys.exit(main())
