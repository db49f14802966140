"""Secure aggregation (SPEC §VII.2): exact sums under dropouts, clean failure, uniform masks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from dk.fl.field import P, dequantize, quantize
from dk.fl.secagg import SecAggError, prg_field, secure_sum
from dk.fl.shamir import combine_shares, split_secret

N, T, DIM = 6, 4, 257
SESSION = b"test-session"


def _rand(seed):
    rng = np.random.default_rng(seed)
    return lambda k: rng.bytes(k)


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, P, size=DIM, dtype=np.uint64) for u in range(N)}


def _field_sum(vectors):
    return np.array([sum(int(v[i]) for v in vectors) % P for i in range(DIM)], dtype=np.uint64)


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("dropped", [(), (2,), (0, 5)])  # 0, 1 and N - t dropouts
def test_sum_is_exact_under_dropouts(backend, dropped):
    xs = _inputs(1)
    total, survivors, masked = secure_sum(
        xs,
        n=N,
        t=T,
        session=SESSION,
        drop_before_input=dropped,
        random_bytes=_rand(2),
        backend=backend,
    )
    assert survivors == set(range(N)) - set(dropped)
    np.testing.assert_array_equal(total, _field_sum([xs[u] for u in sorted(survivors)]))
    for u in survivors:  # what the coordinator saw is not the input
        assert np.count_nonzero(masked[u] == xs[u]) < 5


def test_silent_survivors_up_to_n_minus_t():
    xs = _inputs(3)  # one drops before its input, one more stays silent at unmasking: 4 answer
    total, survivors, _ = secure_sum(
        xs,
        n=N,
        t=T,
        session=SESSION,
        drop_before_input=[1],
        drop_before_unmask=[4],
        random_bytes=_rand(4),
    )
    np.testing.assert_array_equal(total, _field_sum([xs[u] for u in sorted(survivors)]))


@pytest.mark.parametrize(
    "kw",
    [{"drop_before_input": [0, 1, 2]}, {"drop_before_input": [0, 1], "drop_before_unmask": [3]}],
)
def test_fewer_than_t_fails_cleanly(kw):
    with pytest.raises(SecAggError, match=r"needed$"):
        secure_sum(_inputs(5), n=N, t=T, session=SESSION, random_bytes=_rand(6), **kw)


def test_float_updates_sum_through_quantisation():
    rng = np.random.default_rng(7)
    ups = {u: rng.standard_normal(DIM).astype(np.float32) for u in range(N)}
    q = {u: quantize(x, scale=2.0**16, clip=4.0, n=N) for u, x in ups.items()}
    total, _, _ = secure_sum(q, n=N, t=T, session=SESSION, random_bytes=_rand(8))
    want = np.sum([np.clip(ups[u], -4, 4) for u in range(N)], axis=0)
    np.testing.assert_allclose(dequantize(total, scale=2.0**16), want, atol=N * 2.0**-17)


def test_masked_vector_is_uniform_over_the_field():
    # A constant, maximally structured input: the coordinator's view must still be uniform.
    dim = 40_000
    xs = {u: np.full(dim, 12345, dtype=np.uint64) for u in range(3)}
    _, _, masked = secure_sum(xs, n=3, t=2, session=SESSION, random_bytes=_rand(9))
    bins = 64
    counts = np.bincount((masked[1] * bins // P).astype(np.int64), minlength=bins)
    assert chisquare(counts).pvalue > 0.001
    # The same statistic rejects an unmasked view, and one masked by a short (2**16) mask.
    leaky = (xs[1] + np.random.default_rng(10).integers(0, 1 << 16, dim, dtype=np.uint64)) % P
    for view in (xs[1], leaky):
        bad = np.bincount((view * bins // P).astype(np.int64), minlength=bins)
        assert chisquare(bad).pvalue < 1e-9


def test_prg_is_deterministic_and_seed_dependent():
    a, b = prg_field(b"\1" * 32, 1000), prg_field(b"\1" * 32, 1000, backend="reference")
    np.testing.assert_array_equal(a, b)
    assert np.count_nonzero(a == prg_field(b"\2" * 32, 1000)) < 3
    assert a.max() < P and np.array_equal(prg_field(b"\1" * 32, 10), a[:10])


def test_shamir_threshold():
    r = _rand(11)
    secret = bytes(range(32))
    sh = split_secret(secret, n=5, t=3, random_bytes=r)
    assert combine_shares({0: sh[0], 3: sh[3], 4: sh[4]}, t=3) == secret
    with pytest.raises(SecAggError):
        combine_shares({0: sh[0], 1: sh[1]}, t=3)
    with pytest.raises(SecAggError):  # shares of different secrets do not interpolate
        combine_shares(
            {0: sh[0], 1: sh[1], 2: split_secret(secret, n=5, t=3, random_bytes=r)[2]}, t=3
        )
