"""Weights as torch tensors, and the weights file read and written by the safetensors package."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from format_samples import f32  # noqa: E402

from fireclay_ir import FormatError, Graph, InputSpec, Program, TensorMeta, Weight, load, save  # noqa: E402
from fireclay_ir.safetensors_io import RawTensor, read_safetensors, write_safetensors  # noqa: E402

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 1, 2)]


def random_tensor(dtype: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    t = getattr(torch, dtype)
    if dtype == "bool":
        return torch.rand(shape, generator=gen) > 0.5
    if t.is_floating_point or t.is_complex:
        base = torch.randn(shape, generator=gen, dtype=torch.float64 if not t.is_complex else torch.complex128)
        return base.to(t)
    info = torch.iinfo(t)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(t)


def program_with(tensors: dict[str, torch.Tensor]) -> Program:
    g = Graph("main")
    outs = []
    for i, (name, t) in enumerate(tensors.items()):
        meta = TensorMeta(str(t.dtype).removeprefix("torch."), tuple(t.shape))
        outs.append(g.add_input(f"w{i}", meta, InputSpec("parameter", name)))
    g.set_outputs(outs)
    weights = {name: Weight(TensorMeta(str(t.dtype).removeprefix("torch."), tuple(t.shape),
                                       requires_grad=t.requires_grad), t)
               for name, t in tensors.items()}
    return Program.single(g, weights=weights)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))) if a.numel() else True


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_weights_round_trip_bit_exact(dtype, tmp_path):
    gen = torch.Generator().manual_seed(hash(dtype) % 1000)
    tensors = {f"layer{i}.weight": random_tensor(dtype, shape, gen) for i, shape in enumerate(SHAPES)}
    save(program_with(tensors), tmp_path / "p.fcir.json")
    back = load(tmp_path / "p.fcir.json", weights="torch")
    for name, t in tensors.items():
        assert same(back.weights[name].data, t), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "float16"])
def test_safetensors_package_reads_our_files(dtype, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    gen = torch.Generator().manual_seed(7)
    tensors = {f"t{i}": random_tensor(dtype, shape, gen) for i, shape in enumerate(SHAPES)}
    save(program_with(tensors), tmp_path / "p.fcir.json")
    theirs = st.load_file(str(tmp_path / "p.fcir.safetensors"))
    assert set(theirs) == set(tensors)
    for name, t in tensors.items():
        assert same(theirs[name], t), name


def test_we_read_files_the_safetensors_package_writes(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    gen = torch.Generator().manual_seed(3)
    tensors = {f"{dtype}.{i}": random_tensor(dtype, shape, gen) for dtype in ("float32", "bfloat16", "int8", "bool")
               for i, shape in enumerate(SHAPES)}
    st.save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    raw, meta = read_safetensors(tmp_path / "theirs.safetensors")
    assert meta == {"format": "pt"}
    for name, t in tensors.items():
        r = raw[name]
        assert (r.dtype, r.shape) == (str(t.dtype).removeprefix("torch."), tuple(t.shape))
        assert r.data == bytes(t.reshape(-1).view(torch.uint8).tolist())


def test_noncontiguous_and_foreign_tensors_are_stored_dense(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {"transposed": base.t(), "sliced": base[:, ::2], "grad": torch.ones(3, requires_grad=True)}
    save(program_with(tensors), tmp_path / "p.fcir.json")
    back = load(tmp_path / "p.fcir.json")  # weights="auto" gives torch tensors when torch is there
    for name, t in tensors.items():
        assert torch.equal(back.weights[name].data, t.detach()) and back.weights[name].data.is_contiguous()
    assert back.weights["grad"].data.requires_grad and not back.weights["sliced"].data.requires_grad


def test_tensor_that_disagrees_with_its_weight_type(tmp_path):
    g = Graph("main")
    g.set_outputs([g.add_input("w", f32(2, 3), InputSpec("parameter", "w"))])
    prog = Program.single(g, weights={"w": Weight(f32(2, 3), torch.zeros(3, 2))})
    with pytest.raises(FormatError, match=r"weights\.w: the tensor is float32\[3, 2\] but the weight's type says"):
        save(prog, tmp_path / "p.fcir.json")
    prog.weights["w"].data = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(FormatError, match="float64"):
        save(prog, tmp_path / "p.fcir.json")


def test_raw_writer_rejects_unsupported_dtypes(tmp_path):
    with pytest.raises(FormatError, match="complex128 cannot be stored in safetensors"):
        RawTensor("complex128", (1,), b"\x00" * 16)
    write_safetensors(tmp_path / "ok.safetensors", {"a": RawTensor("int8", (2,), b"\x01\x02")})
    assert read_safetensors(tmp_path / "ok.safetensors")[0]["a"].data == b"\x01\x02"


def test_meta_tensors_have_no_data_to_save(tmp_path):
    prog = program_with({"w": torch.empty(2, 3, device="meta")})
    with pytest.raises(FormatError, match="meta device"):
        save(prog, tmp_path / "p.fcir.json")
