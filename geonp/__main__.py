"""``python -m geonp`` is the ``geonp`` command."""

import sys

from geonp.cli import main

sys.exit(main())
