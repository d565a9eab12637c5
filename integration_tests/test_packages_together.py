"""All fireclay distributions installed together agree on one version."""

import importlib

import pytest

MODULES = ["fireclay_ir", "fireclay_shapes", "fireclay_capture", "fireclay_autograd",
           "fireclay_loops", "fireclay_cpp", "fireclay_triton", "fireclay"]


@pytest.mark.parametrize("name", MODULES)
def test_every_stage_imports_at_the_same_version(name):
    assert importlib.import_module(name).__version__ == importlib.import_module("fireclay").__version__
