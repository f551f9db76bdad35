"""``python -m app`` starts Glassbox, like the ``glassbox`` command."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
