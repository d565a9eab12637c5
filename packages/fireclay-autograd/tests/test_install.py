"""The package installs alone: it imports, and its siblings are of a compatible version."""

import pytest


def test_version_is_lockstep():
    import fireclay_autograd

    assert fireclay_autograd.__version__ == "0.1.0"


def test_incompatible_sibling_is_named(monkeypatch):
    import fireclay_ir as sibling
    from fireclay_ir import IncompatibleSiblingError, require_sibling

    monkeypatch.setattr(sibling, "__version__", "9.9.0")
    with pytest.raises(IncompatibleSiblingError, match="pip install 'fireclay-ir==0.1.\\*'"):
        require_sibling("fireclay-autograd", "0.1.0", "fireclay_ir", "fireclay-ir")
