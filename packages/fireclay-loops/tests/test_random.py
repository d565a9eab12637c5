"""Random ops: counter-based (Philox4x32-10), reproducible for a seed, independent across ops."""

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.reference import philox, run  # noqa: E402


def program(ops, shape=(64, 128)):
    b = AtenBuilder()
    x = b.input(torch.zeros(shape))
    outs = [b.call(op, x, *args) for op, args in ops]
    return b.output(*[o for out in outs for o in (out if isinstance(out, tuple) else (out,))])


def test_philox_matches_the_published_known_answer():
    # Random123's known-answer test for philox4x32-10 with counter 0 and key 0.
    words = philox(0, torch.tensor([0]))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_numbers_and_different_seeds_differ(seed):
    p = program([("rand_like.default", ())])
    x = torch.zeros(64, 128)
    a = run(schedule(lower(p, seed=seed)), x)[0]
    b = run(schedule(lower(p, seed=seed)), x)[0]
    c = run(schedule(lower(p, seed=seed + 1)), x)[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_uniform_and_normal_statistics():
    p = program([("rand_like.default", ()), ("randn_like.default", ())])
    u, n = run(schedule(lower(p, seed=3)), torch.zeros(64, 128))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.02
    assert abs(float(n.mean())) < 0.03 and abs(float(n.std()) - 1) < 0.03
    # two ops of one program never share numbers
    assert abs(float(torch.corrcoef(torch.stack([u.flatten(), n.flatten()]))[0, 1])) < 0.05


def test_dropout_keeps_the_right_fraction_and_scales():
    b = AtenBuilder()
    x = b.input(torch.zeros(64, 128))
    out, mask = b.call("native_dropout.default", x, 0.3, True)
    p = b.output(out, mask)
    xv = torch.randn(64, 128)
    got, keep = run(schedule(lower(p, seed=11)), xv)
    assert keep.dtype == torch.bool
    assert abs(float(keep.float().mean()) - 0.7) < 0.02
    torch.testing.assert_close(got, xv * keep / 0.7)


def test_bernoulli_probability():
    p = program([("bernoulli.p", (0.25,))])
    (got,) = run(schedule(lower(p, seed=5)), torch.zeros(64, 128))
    assert set(got.unique().tolist()) <= {0.0, 1.0}
    assert abs(float(got.mean()) - 0.25) < 0.02
