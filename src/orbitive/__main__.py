"""``python -m orbitive`` runs the ``orbit`` command."""

import sys

from .cli import main

sys.exit(main())
