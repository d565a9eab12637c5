"""The compile cache across processes: a second compile of the same model for the same inputs
reuses the autograd and loops artifacts (and fireclay-cpp's libraries), gives eager's results,
and anything that changes the compiled code misses."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fireclay
from fireclay import compile_cache


class Block(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, width)
        self.norm = torch.nn.LayerNorm(width)
        self.fc2 = torch.nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(x)))).softmax(-1)


@pytest.fixture
def cache_dir(tmp_path):
    with fireclay.config.shared.patch(cache_dir=str(tmp_path / "cache")), fireclay.config.patch(compile_cache=True):
        fireclay.reset_cache_stats()
        yield tmp_path / "cache"
    fireclay.reset_cache_stats()


def _run(model: torch.nn.Module, x: torch.Tensor, train: bool) -> None:
    """Compile ``model`` afresh, run it, and check outputs (and gradients) against eager."""
    compiled = fireclay.compile(model)
    reference = Block(model.fc1.out_features).to(x.dtype)
    reference.load_state_dict(model.state_dict())
    if train:
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, expected = compiled(xc), reference(xe)
        torch.testing.assert_close(out, expected)
        cot = torch.randn_like(out)
        out.backward(cot)
        expected.backward(cot)
        torch.testing.assert_close(xc.grad, xe.grad)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = None
    else:
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), reference(x))


def _stats(stage: str) -> dict:
    return fireclay.cache_stats()[stage]


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_second_compile_hits_every_stage_and_matches_eager(cache_dir, train):
    torch.manual_seed(0)
    model = Block()
    _run(model, torch.randn(3, 8), train)
    first = fireclay.cache_stats()
    assert first["autograd"]["misses"] == first["autograd"]["stored"] == 1
    assert first["loops"]["misses"] == first["loops"]["stored"] == (2 if train else 1)
    assert first["autograd"]["hits"] == first["loops"]["hits"] == 0
    assert any((cache_dir / "cpp").iterdir())  # code generation caches under the same folder

    fireclay.reset_cache_stats()
    _run(model, torch.randn(3, 8), train)  # fresh values, same metadata
    second = fireclay.cache_stats()
    assert second["autograd"]["hits"] == 1 and second["autograd"]["misses"] == 0
    assert second["loops"]["hits"] == (2 if train else 1) and second["loops"]["misses"] == 0


@pytest.mark.parametrize("change", ["shape", "dtype", "model", "requires_grad", "config"])
def test_a_change_that_matters_misses(cache_dir, change):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 8)
    _run(model, x, train=False)
    fireclay.reset_cache_stats()
    loops_config = fireclay_loops_config()
    if change == "shape":
        _run(model, torch.randn(5, 8), train=False)
    elif change == "dtype":
        _run(model.double(), x.double(), train=False)
    elif change == "model":
        _run(Block(width=24), x, train=False)
    elif change == "requires_grad":
        _run(model, x, train=True)
    else:
        previous = loops_config.max_inline_ops
        loops_config.max_inline_ops = previous + 1
        try:
            _run(model, x, train=False)
        finally:
            loops_config.max_inline_ops = previous
    stats = fireclay.cache_stats()
    if change == "config":  # fireclay-loops' settings key the loops stage only
        assert stats["autograd"]["hits"] == 1 and stats["loops"]["hits"] == 0 and stats["loops"]["misses"] >= 1
    else:
        assert stats["autograd"]["hits"] == 0 and stats["autograd"]["misses"] == 1


def _softmax_t(x):
    return torch.softmax(x.t() * 2.0, dim=-1).sum(dim=0)


def _norm_cat(x):
    h = torch.nn.functional.layer_norm(x, x.shape[-1:])
    return torch.cat([h, x.exp()], dim=0).amax(dim=1)


def _index_where(x):
    idx = torch.tensor([2, 0, 1])
    return torch.where(x[idx] > 0, x[idx], x[idx] * 0.1).cumsum(0)


def _matmul_views(x):
    y = x.reshape(3, 8)[:, 1:5].t()
    return (y @ x.t()[:, :3].t() + 1.0).var(dim=-1)


def _integer_ops(x):
    return (x * 10).to(torch.int64).remainder(3).sum() + x.argmax()


@pytest.mark.parametrize("fn", [_softmax_t, _norm_cat, _index_where, _matmul_views, _integer_ops],
                         ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_programs_read_back_from_the_cache_match_eager(cache_dir, fn, train):
    if train and fn is _integer_ops:
        pytest.skip("no gradient through integer outputs")
    for expect_hits in (0, 1):
        fireclay.reset_cache_stats()
        x = torch.randn(6, 4, dtype=torch.float64, requires_grad=train)
        compiled = fireclay.compile(fn)
        with torch.set_grad_enabled(train):
            got, expected = compiled(x), fn(x)
            torch.testing.assert_close(got, expected)
            if train:
                (gx,) = torch.autograd.grad(got.sum(), x)
                (ex,) = torch.autograd.grad(expected.sum(), x)
                torch.testing.assert_close(gx, ex)
        stats = fireclay.cache_stats()
        assert stats["autograd"]["hits"] == expect_hits and stats["autograd"]["misses"] == 1 - expect_hits
        assert stats["loops"]["misses"] == (0 if expect_hits else stats["loops"]["stored"])


def test_a_schedule_that_reads_back_differently_is_not_stored(cache_dir, monkeypatch, caplog):
    import fireclay_loops

    real = fireclay_loops.from_program

    def lossy(program, **kwargs):
        scheduled = real(program, **kwargs)
        scheduled.steps = scheduled.steps[:-1]  # as if the format had dropped a step
        return scheduled

    monkeypatch.setattr(fireclay_loops, "from_program", lossy)
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="fireclay.cache"):
        _run(Block(), torch.randn(3, 8), train=False)
    stats = fireclay.cache_stats()["loops"]
    assert stats["uncacheable"] == 1 and stats["stored"] == 0
    assert "reads back differently" in caplog.text
    assert not (cache_dir / "artifacts" / "loops").exists()


def fireclay_loops_config():
    import fireclay_loops

    return fireclay_loops.config


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "wrong_payload"])
def test_a_corrupt_entry_is_detected_and_rebuilt(cache_dir, damage, caplog):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 8)
    _run(model, x, train=True)
    entries = sorted((cache_dir / "artifacts").rglob("*.json"))
    assert len(entries) == 3  # autograd training, loops forward, loops backward
    for path in entries:
        text = path.read_text()
        header, _, payload = text.partition("\n")
        if damage == "truncate":
            path.write_text(text[: len(text) // 2])
        elif damage == "flip":
            i = len(header) + 1 + len(payload) // 3
            path.write_text(text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1:])
        elif damage == "garbage":
            path.write_bytes(b"\xff\xfe not json")
        else:  # a valid checksum over a payload that is not an artifact: caught when loading
            from hashlib import sha256

            bad = "{}"
            parts = header.split(" ")
            parts[2] = sha256(bad.encode()).hexdigest()
            path.write_text(" ".join(parts) + "\n" + bad)
    fireclay.reset_cache_stats()
    with caplog.at_level(logging.WARNING, logger="fireclay.cache"):
        _run(model, torch.randn(3, 8), train=True)
    stats = fireclay.cache_stats()
    assert stats["autograd"]["corrupt"] == 1 and stats["loops"]["corrupt"] == 2
    assert stats["autograd"]["stored"] == 1 and stats["loops"]["stored"] == 2  # rebuilt and rewritten
    assert "corrupt" in caplog.text or "does not load" in caplog.text
    fireclay.reset_cache_stats()
    _run(model, torch.randn(3, 8), train=True)
    assert fireclay.cache_stats()["autograd"]["hits"] == 1 and fireclay.cache_stats()["loops"]["hits"] == 2


def test_switched_off_it_neither_reads_nor_writes(cache_dir):
    torch.manual_seed(0)
    model = Block()
    with fireclay.config.patch(compile_cache=False):
        _run(model, torch.randn(3, 8), train=True)
    assert not (cache_dir / "artifacts").exists()
    assert all(v == 0 for stage in fireclay.cache_stats().values() for v in stage.values())


def test_the_log_says_which_stages_hit(cache_dir, caplog):
    torch.manual_seed(0)
    model = Block()
    with caplog.at_level(logging.INFO, logger="fireclay.cache"):
        _run(model, torch.randn(3, 8), train=False)
        _run(model, torch.randn(3, 8), train=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "fireclay.cache"]
    assert [line.split(" (")[0] for line in lines] == [
        "compile cache: autograd inference artifact miss", "compile cache: loops miss",
        "compile cache: autograd inference artifact hit", "compile cache: loops hit"]


def test_entries_are_written_atomically(cache_dir, monkeypatch):
    compile_cache.write_entry("loops", "ab" * 32, "first")
    path = Path(compile_cache.entry_path("loops", "ab" * 32))

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        compile_cache.write_entry("loops", "ab" * 32, "second")
    monkeypatch.undo()
    assert compile_cache.read_entry("loops", "ab" * 32) == "first"  # the old entry is intact
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    import fireclay
    sys.path.insert(0, {tests!r})
    from test_compile_cache import Block, _run

    torch.manual_seed(0)
    model = Block()
    start = time.perf_counter()
    _run(model, torch.randn(3, 8), train=False)
    _run(model, torch.randn(3, 8), train=True)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({{"stats": fireclay.cache_stats(), "seconds": seconds}}))
""")


def _process(script: Path, cache: Path) -> dict:
    env = dict(os.environ, FIRECLAY_CACHE_DIR=str(cache))
    env.pop("FIRECLAY_COMPILE_CACHE", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_two_processes_share_the_cache(tmp_path):
    script = tmp_path / "compile_twice.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent)))
    cold = _process(script, tmp_path / "cache")
    warm = _process(script, tmp_path / "cache")
    # inference: 1 autograd artifact + 1 loops program; training: 1 + 2 (forward, backward)
    assert cold["stats"]["autograd"]["misses"] == 2 and cold["stats"]["autograd"]["hits"] == 0
    assert cold["stats"]["loops"]["misses"] == 3 and cold["stats"]["loops"]["hits"] == 0
    assert warm["stats"]["autograd"] | {"hits": 2, "misses": 0} == warm["stats"]["autograd"]
    assert warm["stats"]["loops"]["hits"] == 3 and warm["stats"]["loops"]["misses"] == 0
    assert warm["stats"]["autograd"]["build_seconds"] == 0 == warm["stats"]["loops"]["build_seconds"]
    print(f"cold process compile+run {cold['seconds']:.2f} s, warm {warm['seconds']:.2f} s")


def test_aten_programs_are_named_by_their_artifact_not_serialized_again(cache_dir, monkeypatch):
    serialized = []
    real = compile_cache.program_text

    def counting(program):
        serialized.append(program.producer[0])
        return real(program)

    monkeypatch.setattr(compile_cache, "program_text", counting)
    torch.manual_seed(0)
    model = Block()
    for _ in range(2):  # cold, then warm
        _run(model, torch.randn(3, 8), train=True)
    # Only the captured programs (one per compile) are serialized to make keys; the aten
    # programs going to the loops stage are named by the artifact they came from. The loops
    # programs are serialized once each, to be stored.
    assert serialized.count("fireclay-autograd") == 0
    assert serialized.count("fireclay-loops") == 2
    assert fireclay.cache_stats()["loops"]["hits"] == 2
