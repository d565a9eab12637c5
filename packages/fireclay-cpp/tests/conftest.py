"""Tests compile into the ordinary cache (``FIRECLAY_CACHE_DIR`` or the user's cache folder): its
keys are content hashes, so a warm cache is always right, and xdist workers share builds.
Tests of the cache itself use folders of their own."""

import os
import sys

HERE = os.path.dirname(__file__)
LOOPS_TESTS = os.path.normpath(os.path.join(HERE, "..", "..", "fireclay-loops", "tests"))
sys.path.insert(0, HERE)
if os.path.isdir(LOOPS_TESTS):
    sys.path.append(LOOPS_TESTS)  # fireclay-loops' op table and aten builder, read from the checkout
