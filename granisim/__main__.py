"""``python -m granisim``: the ``granisim`` command."""

import sys

from granisim.cli import main

sys.exit(main())
