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


# --- SecAgg+ (Bell et al., CCS 2020): sparse random k-regular graph --------------------------

NP, KP, TP = 12, 4, 3  # neighbourhoods of k + 1 = 5 clients, threshold 3 in each


def _inputs_n(seed, n, dim=DIM):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, P, size=dim, dtype=np.uint64) for u in range(n)}


def _max_dropouts(graph, t):
    """Greedy: drop clients while every neighbourhood keeps at least t survivors."""
    alive = set(range(len(graph)))
    for u in range(len(graph)):
        trial = alive - {u}
        if all(len((graph[v] | {v}) & trial) >= t for v in range(len(graph))):
            alive = trial
    return sorted(set(range(len(graph))) - alive)


def test_secaggplus_graph_is_k_regular_and_derived_from_the_session():
    from dk.fl.graph import complete_graph, default_degree, harary_graph

    g = harary_graph(NP, KP, SESSION)
    assert all(len(nb) == KP and u not in nb for u, nb in enumerate(g))
    assert all(u in g[v] for u in range(NP) for v in g[u])  # symmetric
    assert g == harary_graph(NP, KP, SESSION) and g != harary_graph(NP, KP, b"other")
    assert harary_graph(NP, NP - 1, SESSION) == complete_graph(NP)
    assert default_degree(10) == 8 and default_degree(1000) == 20 and default_degree(3) == 2
    with pytest.raises(ValueError, match="even"):
        harary_graph(NP, 3, SESSION)


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("case", ["none", "one", "max"])
def test_secaggplus_sum_is_exact_under_dropouts(backend, case):
    from dk.fl.graph import harary_graph

    graph = harary_graph(NP, KP, SESSION)
    most = _max_dropouts(graph, TP)
    assert len(most) >= 3  # more than any one neighbourhood could lose under SecAgg's t
    dropped = {"none": [], "one": [7], "max": most}[case]
    xs = _inputs_n(12, NP)
    total, survivors, masked = secure_sum(
        xs,
        n=NP,
        t=TP,
        session=SESSION,
        drop_before_input=dropped,
        random_bytes=_rand(13),
        backend=backend,
        degree=KP,
    )
    assert survivors == set(range(NP)) - set(dropped)
    want = np.zeros(DIM, dtype=object)
    for u in survivors:
        want = want + xs[u].astype(object)
    np.testing.assert_array_equal(total, (want % P).astype(np.uint64))
    for u in survivors:
        assert np.count_nonzero(masked[u] == xs[u]) < 5


def test_secaggplus_complete_degree_tolerates_n_minus_t():
    xs = _inputs(14)
    total, survivors, _ = secure_sum(
        xs,
        n=N,
        t=T,
        session=SESSION,
        drop_before_input=[1, 3],
        random_bytes=_rand(15),
        degree=N - 1,
    )
    np.testing.assert_array_equal(total, _field_sum([xs[u] for u in sorted(survivors)]))


def test_secaggplus_fewer_than_t_in_a_neighbourhood_fails_cleanly():
    from dk.fl.graph import harary_graph

    graph = harary_graph(NP, KP, SESSION)
    victim = 5
    gone = sorted(graph[victim])[: KP + 1 - TP + 1]  # leaves t - 1 alive around client 5
    with pytest.raises(SecAggError, match=r"needed$"):
        secure_sum(
            _inputs_n(16, NP),
            n=NP,
            t=TP,
            session=SESSION,
            drop_before_input=gone,
            random_bytes=_rand(17),
            degree=KP,
        )


def test_secaggplus_masked_vector_is_uniform_over_the_field():
    dim, n = 40_000, 8
    xs = {u: np.full(dim, 12345, dtype=np.uint64) for u in range(n)}
    _, _, masked = secure_sum(xs, n=n, t=2, session=SESSION, random_bytes=_rand(18), degree=2)
    bins = 64
    counts = np.bincount((masked[3] * bins // P).astype(np.int64), minlength=bins)
    assert chisquare(counts).pvalue > 0.001
    bad = np.bincount((xs[3] * bins // P).astype(np.int64), minlength=bins)
    assert chisquare(bad).pvalue < 1e-9


def test_secaggplus_clients_talk_only_to_neighbours():
    from dk.fl.secagg import SecAggClient

    cs = [
        SecAggClient(u, n=NP, t=TP, session=SESSION, random_bytes=_rand(19 + u), degree=KP)
        for u in range(NP)
    ]
    adverts = {u: c.advertise() for u, c in enumerate(cs)}
    out = cs[0].share_keys(adverts)
    assert set(out) == set(cs[0].graph[0]) and len(out) == KP


def test_client_state_round_trip_and_b_commitment_blame():
    from dk.fl.secagg import SecAggClient, SecAggServer, commit_b

    xs = _inputs(20)
    cs = {
        u: SecAggClient(u, n=N, t=T, session=SESSION, random_bytes=_rand(21 + u)) for u in range(N)
    }
    commits = {u: c.b_commitment() for u, c in cs.items()}
    commits[2] = commit_b(b"\0" * 32, SESSION)  # client 2's verifier saw another seed
    server = SecAggServer(n=N, t=T, dim=DIM, session=SESSION, b_commits=commits)
    keys = server.collect_adverts({u: c.advertise() for u, c in cs.items()})
    inbox = server.route_shares({u: c.share_keys(keys) for u, c in cs.items()})
    cs = {u: SecAggClient.from_state(c.to_state()) for u, c in cs.items()}  # across messages
    masked = {u: cs[u].masked_input(xs[u], inbox[u]) for u in range(N)}
    u3, d = server.collect_masked(masked)
    with pytest.raises(SecAggError, match="client 2's self-mask seed"):
        server.unmask({u: cs[u].unmask(u3, d) for u in u3})
    server.b_commits = {u: c.b_commitment() for u, c in cs.items()}
    total = server.unmask({u: cs[u].unmask(u3, d) for u in u3})
    np.testing.assert_array_equal(total, _field_sum([xs[u] for u in range(N)]))
