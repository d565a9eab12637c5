"""Lowering aten ops to loop nodes: :func:`~fireclay_loops.lowering.driver.lower` drives the
rule tables of :mod:`.pointwise`, :mod:`.reductions`, :mod:`.views`, :mod:`.indexing` and
:mod:`.extern` (one registration per aten op, see :mod:`.registry`)."""
