"""The ops kept whole beside the core ATen set: data of the aten registry, torch-free."""

from __future__ import annotations

import re
import subprocess
import sys

from fireclay_ir.dialects import core_aten_ops, core_ops, kept_whole_ops, kept_whole_reasons

_NAME = re.compile(r"^aten::[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def test_kept_whole_ops_are_named_overloads_with_reasons():
    kept = kept_whole_ops()
    assert len(kept) == len(set(kept)) >= 20
    assert all(_NAME.match(op) for op in kept), [op for op in kept if not _NAME.match(op)]
    reasons = kept_whole_reasons()
    assert set(reasons) == set(kept) and all(len(why) > 20 for why in reasons.values())
    for op in ("aten::view.default", "aten::copy.default", "aten::_scaled_dot_product_flash_attention.default"):
        assert op in kept


def test_each_kept_op_is_documented_in_the_docstring():
    doc = kept_whole_ops.__doc__
    for op in kept_whole_ops():
        stem = op.removeprefix("aten::").split(".")[0]
        assert stem in doc or stem.removesuffix("_for_cpu") in doc or "_scaled_dot_product" in stem, op


def test_core_aten_ops_is_the_core_data():
    assert core_aten_ops() == core_ops()
    assert "aten::add.Tensor" in core_aten_ops()


def test_reading_them_does_not_import_torch():
    code = ("import sys; from fireclay_ir.dialects import kept_whole_ops, core_aten_ops; "
            "assert kept_whole_ops() and core_aten_ops(); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
