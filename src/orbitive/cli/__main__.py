"""``python -m orbitive.cli`` runs the ``orbit`` command."""

import sys

from . import main

sys.exit(main())
