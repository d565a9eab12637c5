"""Golden files: documents of every released format version that must load forever.

``golden/v<MAJOR>.<MINOR>/`` holds, per sample program, the canonical document
(``<name>.fcir.json``), its weights file where it has data (``<name>.fcir.safetensors``) and its
printed text (``<name>.txt``). Files of released versions are never rewritten. The current
version's files are regenerated from tests/format_samples.py with
``FIRECLAY_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py``; review the diff before
committing it.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import struct

import pytest
from format_samples import SAMPLES

from fireclay_ir import FORMAT_VERSION, Program, dumps, format_program, load, save

GOLDEN = pathlib.Path(__file__).parent / "golden"
CURRENT = GOLDEN / f"v{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}"
SCHEMA = pathlib.Path(__file__).resolve().parents[3] / "docs" / "format" / "schema-v1.json"
ALL_GOLDENS = sorted(GOLDEN.glob("v*/*.fcir.json"))


def golden_weight_bytes(name: str, numel: int) -> bytes:
    """Deterministic float32 data for a golden weight (no RNG, so no torch needed)."""
    seed = sum(name.encode())
    return struct.pack(f"<{numel}f", *[((i * 37 + seed) % 17 - 8) / 8 for i in range(numel)])


def golden_program(name: str) -> Program:
    prog = SAMPLES[name]()
    for wname, w in prog.weights.items():
        w.data = golden_weight_bytes(wname, math.prod(w.meta.shape))
    return prog


def _regenerate() -> None:
    CURRENT.mkdir(parents=True, exist_ok=True)
    for name in SAMPLES:
        prog = golden_program(name)
        save(prog, CURRENT / f"{name}.fcir.json")
        (CURRENT / f"{name}.txt").write_text(format_program(prog), encoding="utf-8")


if os.environ.get("FIRECLAY_REGEN_GOLDEN") == "1":
    _regenerate()
    ALL_GOLDENS = sorted(GOLDEN.glob("v*/*.fcir.json"))


def test_every_sample_has_a_current_golden():
    assert {p.name.removesuffix(".fcir.json") for p in CURRENT.glob("*.fcir.json")} == set(SAMPLES)


@pytest.mark.parametrize("path", ALL_GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_loads_and_verifies_forever(path):
    prog = load(path, weights="bytes")  # upgrading older majors, verifying, reading the weights file
    assert prog.main.nodes and prog.format_version[0] == FORMAT_VERSION[0]
    for wname, w in prog.weights.items():
        assert w.data == golden_weight_bytes(wname, math.prod(w.meta.shape))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_current_golden_prints_as_recorded(name):
    """The printed text is golden too (for the current version: the printer may improve later)."""
    prog = load(CURRENT / f"{name}.fcir.json", weights="none")
    assert format_program(prog) == (CURRENT / f"{name}.txt").read_text(encoding="utf-8")
    assert format_program(golden_program(name)) == (CURRENT / f"{name}.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_current_golden_is_what_the_writer_writes(name, tmp_path):
    """Same program, same bytes: the builder's document equals the golden byte for byte, and
    load -> save reproduces both files exactly."""
    golden_json = CURRENT / f"{name}.fcir.json"
    assert dumps(golden_program(name)).encode() == golden_json.read_bytes()
    save(load(golden_json, weights="bytes"), tmp_path / "again.fcir.json")
    assert (tmp_path / "again.fcir.json").read_bytes() == golden_json.read_bytes()
    golden_weights = golden_json.with_name(f"{name}.fcir.safetensors")
    again_weights = tmp_path / "again.fcir.safetensors"
    assert golden_weights.exists() == again_weights.exists()
    if golden_weights.exists():
        assert again_weights.read_bytes() == golden_weights.read_bytes()


@pytest.mark.parametrize("path", ALL_GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_validates_against_the_schema(path):
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.exists():
        pytest.skip("docs/format is not part of this checkout")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), schema,
                        cls=jsonschema.Draft202012Validator)


def test_schema_rejects_what_the_reader_rejects():
    """The schema is not vacuous: it refuses documents with a broken field."""
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.exists():
        pytest.skip("docs/format is not part of this checkout")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    good = json.loads((CURRENT / "torch_dialect.fcir.json").read_text(encoding="utf-8"))
    breakages = [
        lambda d: d.pop("entry"),
        lambda d: d.update(format_version="2.0"),
        lambda d: d["graphs"]["forward"]["nodes"][0]["args"].append({"int": 1, "float": 2.0}),
        lambda d: d["graphs"]["forward"]["nodes"][0].update(op="no_dialect"),
        lambda d: d["graphs"]["forward"]["inputs"][0]["type"]["tensor"].update(dtype="float"),
        lambda d: d["graphs"]["forward"]["nodes"][1]["args"][1].update(sym="__import__('os')"),
        lambda d: d["symbols"]["s0"].update(hint=1.5),
    ]
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(good)
    for breakage in breakages:
        doc = json.loads(json.dumps(good))
        breakage(doc)
        assert not validator.is_valid(doc), breakage


def test_golden_mlp_runs_like_eager():
    """The golden MLP, loaded with torch weights, computes what eager torch computes with them."""
    torch = pytest.importorskip("torch")
    from fireclay_ir.interpreter import interpret

    prog = load(CURRENT / "mlp_aten.fcir.json", weights="torch")
    params = {name: w.data for name, w in prog.weights.items()}
    for batch in (2, 5, 9):
        x = torch.randn(batch, 16)
        h = torch.relu(torch.addmm(params["fc0.bias"], x, params["fc0.weight"].t()))
        expected = torch.addmm(params["fc1.bias"], h, params["fc1.weight"].t())
        (got,) = interpret(prog, x)
        torch.testing.assert_close(got, expected)
