"""Passes: named IR -> IR functions, and the PassManager that runs them.

``GENERIC_PIPELINE`` is the clean-up every stage may run on its output; read it as a table of
contents of this package.
"""

from fireclay_ir.passes.basic import (
    common_subexpression_elimination,
    dead_code_elimination,
    prune_unused_graphs,
    topological_sort,
)
from fireclay_ir.passes.effects import has_side_effects, is_pure
from fireclay_ir.passes.inline import inline_subgraphs
from fireclay_ir.passes.manager import PassManager, PassRecord, fingerprint
from fireclay_ir.passes.rewrite import Match, Pattern, copy_graph_into, find_matches, rewrite, rewrite_pass
from fireclay_ir.passes.split import ProgramPiece, SplitProgram, split_program

GENERIC_PIPELINE = [
    inline_subgraphs,                  # checkpointed regions become plain nodes (forward view)
    topological_sort,                  # every value defined before it is read, order kept otherwise
    common_subexpression_elimination,  # identical pure calls computed once
    dead_code_elimination,             # unread pure nodes removed; side effects kept
    prune_unused_graphs,               # sub-graphs no node refers to any more dropped
]

__all__ = [
    "GENERIC_PIPELINE", "Match", "PassManager", "PassRecord", "Pattern", "ProgramPiece", "SplitProgram", "common_subexpression_elimination",
    "copy_graph_into", "dead_code_elimination", "find_matches", "fingerprint", "has_side_effects",
    "inline_subgraphs", "is_pure", "prune_unused_graphs", "rewrite", "rewrite_pass", "split_program",
    "topological_sort",
]
