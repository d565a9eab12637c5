"""Type promotion without torch, checked against torch.result_type."""

import itertools

import pytest

from fireclay_loops import dtypes

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def test_known_promotions():
    assert dtypes.result_type([("int64", 2)], [2.5]) == "float32"
    assert dtypes.result_type([("float16", 2), ("float32", 0)]) == "float16"
    assert dtypes.result_type([("int32", 1), ("float64", 0)]) == "float64"
    assert dtypes.result_type([("bool", 1)], [3]) == "int64"
    assert dtypes.promote_types("uint8", "int8") == "int16"
    assert dtypes.promote_types("float16", "bfloat16") == "float32"


def test_matches_torch_on_every_pair_of_dtypes_ranks_and_scalars():
    torch = pytest.importorskip("torch")
    for a, b in itertools.product(NAMES, repeat=2):
        for ra, rb in ((1, 1), (1, 0), (0, 1), (0, 0)):
            ta = torch.zeros([2] * ra, dtype=getattr(torch, a))
            tb = torch.zeros([2] * rb, dtype=getattr(torch, b))
            want = str(torch.result_type(ta, tb)).removeprefix("torch.")
            assert dtypes.result_type([(a, ra), (b, rb)]) == want, (a, ra, b, rb)
        for scalar in (True, 3, 2.5):
            want = str(torch.result_type(torch.zeros(2, dtype=getattr(torch, a)), scalar)).removeprefix("torch.")
            assert dtypes.result_type([(a, 1)], [scalar]) == want, (a, scalar)
