"""Hostile expression strings: ``parse`` refuses numbers no size needs, quickly and with its own
error, before sympy spends seconds or gigabytes on them."""

from __future__ import annotations

import time

import pytest

import fireclay_shapes as fs


@pytest.mark.parametrize("text, why", [
    ("10**10000000", "exponent 10000000 is larger than the limit"),
    ("s0**100000", "exponent 100000 is larger than the limit"),
    ("1000**1000", "has more than 4096 bits"),
    ("9" * 5000, "5000 digits is longer than the limit"),
    ("s0 + " + "1" * 100, "100 digits is longer than the limit"),
    # each `**` within the limit, the folded power far beyond it (evaluating it never ended)
    ("((s0**1000)**1000)**1000", "has an exponent larger than the limit"),
    ("s0**1000*s0**1000", "has an exponent larger than the limit"),
])
def test_numbers_no_size_needs_fail_fast_with_a_parse_error(text, why):
    start = time.perf_counter()
    with pytest.raises(fs.ExprParseError, match=why):
        fs.parse(text)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("text", ["s0**3 + 2**62", "9223372036854775807 - s1", "2**64*s0", "s0**64"])
def test_sizes_and_guards_a_program_holds_still_parse(text):
    assert fs.dumps(fs.parse(text)) == fs.dumps(fs.parse(fs.dumps(fs.parse(text))))
