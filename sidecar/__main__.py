"""``python -m sidecar``: the same as the ``sidecar`` command."""

import sys

from sidecar.entry.cli import main

sys.exit(main())
