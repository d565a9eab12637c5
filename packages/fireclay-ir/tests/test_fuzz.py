"""Fuzzing the reader: junk and mutated documents only ever raise the package's own error.

Whatever a file holds, loading it either gives a Program that saves back to the same bytes, or
raises IRError (FormatError, or the verifier's error) — never KeyError, TypeError, RecursionError
or anything else from deep inside. Thousands of cases run in a few seconds in CI.
"""

from __future__ import annotations

import copy
import json
import random
import struct

import pytest
from format_samples import SAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireclay_ir import (
    DTYPES,
    Device,
    DType,
    Graph,
    GraphRef,
    InputSpec,
    IRError,
    Layout,
    Limits,
    MemoryFormat,
    Program,
    ScalarType,
    SymExpr,
    TensorMeta,
    Weight,
    dumps,
    format_program,
    load,
    loads,
    save,
)

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL = Limits(max_nodes=200, max_values=800, max_string_chars=4096)
GOOD_TEXTS = {name: dumps(build()) for name, build in SAMPLES.items()}
GOOD_DOCS = {name: json.loads(text) for name, text in GOOD_TEXTS.items()}


def outcome(text: str) -> str:
    """Load ``text``: "ok" (and then it must round-trip) or "rejected" (IRError); anything else
    propagates and fails the test."""
    try:
        prog = loads(text, limits=SMALL)
    except IRError:
        return "rejected"
    again = dumps(prog)
    assert dumps(loads(again, limits=SMALL)) == again
    return "ok"


json_atoms = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
              | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(json_atoms, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@FUZZ
@given(json_values)
def test_arbitrary_json(value):
    assert outcome(json.dumps(value)) == "rejected"


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    outcome(text)


@settings(FUZZ, max_examples=200)
@given(st.dictionaries(st.sampled_from(sorted(GOOD_DOCS["torch_dialect"]) + ["junk"]), json_values, max_size=8),
       st.sampled_from(["1.0", "0.9", "1.7", "2.0", "x", 1]))
def test_top_level_junk(fields, version):
    fields["format_version"] = version
    assert outcome(json.dumps(fields)) == "rejected"


# --------------------------------------------------------------------------- mutations


def paths(x, prefix=()):
    """Every (container path, key) location in a JSON document."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield prefix + (k,)
            yield from paths(v, prefix + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield prefix + (i,)
            yield from paths(v, prefix + (i,))


def get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


REPLACEMENTS = [None, True, 0, -1, 2**63, -(2**64), 1e308, 0.5, "", "v0", "x", "s0", "aten::add.Tensor",
                "__import__('os').system('true')", [], {}, [[[[]]]], {"value": "v0"}, {"int": 1},
                {"graph": "main"}, {"tensor": {}}, {"scalar": "int"}, "main", "forward", "true_branch",
                "a" * 5000, "\ud800", "float32", "cuda:0", {"kind": "parameter", "target": "fc0.weight"}]


def mutate(doc, rng: random.Random):
    """One random structural change to a copy of ``doc``."""
    doc = json.loads(json.dumps(doc))
    where = rng.choice(list(paths(doc)))
    parent, key = get(doc, where[:-1]), where[-1]
    kind = rng.randrange(8)
    if kind == 0:  # delete the key or item
        del parent[key]
    elif kind == 1:  # replace with something of another kind
        parent[key] = copy.deepcopy(rng.choice(REPLACEMENTS))
    elif kind == 2 and isinstance(parent, list):  # duplicate an item (duplicate names, extra args)
        parent.insert(key, copy.deepcopy(parent[key]))
    elif kind == 3:  # swap with another location's content (dangling refs, type confusion)
        other = rng.choice(list(paths(doc)))
        try:
            parent[key] = copy.deepcopy(get(doc, other))
        except (KeyError, IndexError, TypeError):
            pass
    elif kind == 4:  # wrap deeply
        value = parent[key]
        for _ in range(rng.choice([1, 10, 60, 200])):
            value = [value] if rng.random() < 0.5 else {"list": [value]}
        parent[key] = value
    elif kind == 5 and isinstance(parent[key], str):  # rename: dangling references, bad names
        parent[key] = parent[key] + rng.choice(["_", "x", ".", " ", "0", "::", "-"])
    elif kind == 6 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = rng.choice([parent[key] * 10**30, -parent[key] - 1, float(parent[key]), str(parent[key])])
    elif kind == 7 and isinstance(parent, dict):  # an extra key
        parent[f"{key}_extra"] = copy.deepcopy(parent[key])
    return doc


@pytest.mark.parametrize("name", sorted(GOOD_DOCS))
def test_structural_mutations(name):
    rng = random.Random(f"structural-{name}")
    seen = {"ok": 0, "rejected": 0}
    doc = GOOD_DOCS[name]
    for _ in range(500):
        mutated = mutate(doc, rng)
        if rng.random() < 0.3:
            mutated = mutate(mutated, rng)
        seen[outcome(json.dumps(mutated))] += 1
    # Both outcomes happen: the fuzzer is not only feeding junk the first check throws out.
    assert seen["rejected"] > 200 and seen["ok"] > 10, seen


@pytest.mark.parametrize("name", sorted(GOOD_TEXTS))
def test_text_mutations(name):
    rng = random.Random(f"text-{name}")
    text = GOOD_TEXTS[name]
    for _ in range(400):
        i = rng.randrange(len(text))
        choice = rng.randrange(4)
        if choice == 0:
            broken = text[:i]  # truncated
        elif choice == 1:
            broken = text[:i] + text[i + 1:]
        elif choice == 2:
            broken = text[:i] + rng.choice('{}[]",:0-e.\\ \x00\ud800') + text[i:]
        else:
            j = rng.randrange(len(text))
            broken = text[:i] + text[j:j + rng.randrange(1, 40)] + text[i:]
        outcome(broken)


@FUZZ
@given(st.sampled_from(sorted(GOOD_DOCS)), st.randoms(use_true_random=False))
def test_hypothesis_guided_mutations(name, rng):
    outcome(json.dumps(mutate(GOOD_DOCS[name], rng)))


# --------------------------------------------------------------------------- files


def _saved_with_weights(tmp_path):
    prog = SAMPLES["mlp_aten"]()
    for w in prog.weights.values():
        n = 1
        for d in w.meta.shape:
            n *= d
        w.data = struct.pack(f"<{n}f", *range(n))
    path = tmp_path / "m.fcir.json"
    save(prog, path)
    return path, (tmp_path / "m.fcir.safetensors").read_bytes()


def test_weights_file_mutations(tmp_path):
    path, good = _saved_with_weights(tmp_path)
    weights = tmp_path / "m.fcir.safetensors"
    rng = random.Random("weights")
    (n,) = struct.unpack("<Q", good[:8])
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(600):
        data = bytearray(good)
        choice = rng.randrange(5)
        if choice == 0:
            data = data[: rng.randrange(len(data))]
        elif choice == 1:  # a byte in the header
            data[rng.randrange(8, 8 + n)] = rng.randrange(256)
        elif choice == 2:  # the header length
            data[:8] = struct.pack("<Q", rng.choice([0, 1, n - 1, n + 1, 2**63, len(data)]))
        elif choice == 3:  # a plausible header with wrong offsets or dtypes
            header = json.loads(good[8:8 + n])
            name = rng.choice([k for k in header if k != "__metadata__"])
            header[name][rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(
                [[0, 1], [5, 3], [0, 2**70], "F99", [2, 2], [], None, "I8", [-1]])
            text = json.dumps(header).encode()
            data = bytearray(struct.pack("<Q", len(text)) + text + good[8 + n:])
        else:  # a data byte: still loads, with other values
            data[rng.randrange(8 + n, len(data))] ^= 0xFF
        weights.write_bytes(bytes(data))
        try:
            load(path, weights="bytes")
            outcomes["ok"] += 1
        except IRError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 300 and outcomes["ok"] > 50, outcomes


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_files(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("bytes")
    (d / "x.fcir.json").write_bytes(data)
    (d / "x.fcir.safetensors").write_bytes(data)
    with pytest.raises(IRError):
        load(d / "x.fcir.json", weights="bytes")


# --------------------------------------------------------------------------- generated programs

SYMS = ["s0", "s1", "u0"]
dims = st.integers(min_value=0, max_value=2**40) | st.sampled_from(SYMS + ["2*s0", "s0*s1 + 1", "floor(s1/2)"])


@st.composite
def value_types(draw):
    if draw(st.integers(0, 5)) == 0:
        return ScalarType(draw(st.sampled_from(["int", "float", "bool", "opaque"])))
    shape = tuple(draw(st.lists(dims, max_size=4)))
    strides = draw(st.none() | st.lists(dims, min_size=len(shape), max_size=len(shape)).map(tuple))
    return TensorMeta(draw(st.sampled_from(DTYPES)), shape, strides, draw(dims),
                      draw(st.sampled_from(["cpu", "cuda:0", "meta"])), draw(st.booleans()))


atoms = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.floats()
         | st.text(max_size=12) | st.just(...) | st.sampled_from(SYMS + ["2*s0 - 1"]).map(SymExpr)
         | st.sampled_from(DTYPES).map(DType) | st.sampled_from(["cpu", "cuda:3"]).map(Device)
         | st.sampled_from(["strided", "sparse_coo"]).map(Layout)
         | st.sampled_from(["channels_last", "preserve_format"]).map(MemoryFormat))
meta_json = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                         | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
TORCH_OPS = ["torch::torch.add", "torch::torch.cat", "torch::Tensor.view", "torch::operator.getitem",
             "torch::torch.nn.functional.relu", "torch::math.sqrt"]


class _Ref(int):
    """Stands for the i-th value defined so far (strategies are built once, values come later)."""


class _GraphIndex(int):
    """Stands for the i-th graph of the program."""


ARGS = st.recursive(atoms | st.integers(0, 50).map(_Ref) | st.integers(0, 5).map(_GraphIndex),
                    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
                    | st.tuples(inner, inner, inner).map(lambda parts: slice(*parts)), max_leaves=6)


def _resolve(arg, values, names):
    if isinstance(arg, _Ref):
        return values[arg % len(values)] if values else None
    if isinstance(arg, _GraphIndex):
        return GraphRef(names[arg % len(names)])
    if isinstance(arg, list):
        return [_resolve(a, values, names) for a in arg]
    if isinstance(arg, tuple):
        return tuple(_resolve(a, values, names) for a in arg)
    if isinstance(arg, slice):
        return slice(*(_resolve(a, values, names) for a in (arg.start, arg.stop, arg.step)))
    return arg


@st.composite
def programs(draw):
    prog = Program(producer=(draw(st.text(max_size=8)), "1.2"))
    for s in SYMS:
        lo = draw(st.none() | st.integers(0, 4))
        prog.add_symbol(s, draw(st.none() | st.integers(0, 100)), lo, draw(st.none() | st.integers(5, 10**6)))
    prog.guards = draw(st.lists(st.sampled_from(["s0 >= 2", "Eq(s1, 4)", "s0*s1 < 100", "u0 != 0"]), max_size=3))
    names = [f"g{i}" for i in range(draw(st.integers(1, 3)))]
    for gname in names:
        g = Graph(gname)
        values = []
        for i in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["user", "user", "parameter", "buffer", "constant"]))
            t = draw(value_types())
            if kind == "user" or not isinstance(t, TensorMeta):
                values.append(g.add_input(f"in{i}", t))
            else:
                target = f"{gname}.w{i}"
                prog.weights[target] = Weight(t)
                values.append(g.add_input(f"in{i}", t, InputSpec(kind, target)))
        for _ in range(draw(st.integers(0, 6))):
            args = _resolve(draw(st.lists(ARGS, max_size=3)), values, names)
            kwargs = _resolve(draw(st.dictionaries(st.sampled_from(["dim", "alpha", "out_dtype", "k"]), ARGS,
                                                   max_size=2)), values, names) if draw(st.booleans()) else {}
            meta = {"source": {"file": draw(st.text(max_size=10)), "line": draw(st.integers(0, 10**6)),
                               "text": draw(st.text(max_size=20))}} if draw(st.booleans()) else {}
            meta["x.extra"] = draw(meta_json)
            outs = g.call(draw(st.sampled_from(TORCH_OPS)), args, kwargs,
                          out=draw(st.lists(value_types(), max_size=2)), meta=meta)
            values.extend(outs)
        g.set_outputs(_resolve(draw(st.lists(st.integers(0, 50).map(_Ref), max_size=3)), values, names))
        prog.add_graph(g)
    prog.entry = draw(st.sampled_from(names))
    prog.metadata = {"m": draw(meta_json)}
    return prog


@settings(FUZZ, max_examples=120)
@given(programs())
def test_generated_programs_round_trip(prog):
    """Every program the builder can make saves, loads and saves again to the same bytes, and
    prints the same before and after."""
    text = dumps(prog)
    again = loads(text, verify=False)
    assert dumps(again) == text
    assert format_program(again) == format_program(prog)
