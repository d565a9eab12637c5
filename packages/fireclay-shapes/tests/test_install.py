"""The package installs alone: it imports, and its siblings are of a compatible version."""



def test_version_is_lockstep():
    import fireclay_shapes

    assert fireclay_shapes.__version__ == "0.1.0"
