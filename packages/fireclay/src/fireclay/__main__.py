"""``python -m fireclay``: the ``fireclay`` command (:mod:`fireclay.cli`)."""

import sys

from fireclay.cli import main

sys.exit(main())
