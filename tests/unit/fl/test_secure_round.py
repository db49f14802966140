"""Secure aggregation in a Flower round with the PoL gate (SPEC §VII.2), in process."""

from __future__ import annotations

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.common import parameters_to_ndarrays  # noqa: E402

from dk.crypto.keys import SigningKey  # noqa: E402
from dk.fl.client import DkClient  # noqa: E402
from dk.fl.field import P, dequantize, quantize  # noqa: E402
from dk.fl.run import data_index  # noqa: E402
from dk.fl.secagg import Advert, SecAggError  # noqa: E402
from dk.fl.secure_round import (  # noqa: E402
    RoundVerifier,
    SecAggConfig,
    pack_adverts,
    pack_blobs,
    pack_indices,
    unpack_adverts,
    unpack_blobs,
    unpack_indices,
)
from dk.fl.secure_server import SecAggFlowerServer  # noqa: E402
from dk.fl.strategy import DkStrategy  # noqa: E402


class _Proxy:
    """The part of Flower's ClientProxy that fit_clients uses, around a DkClient."""

    def __init__(self, cid, client):
        self.cid, self.client = cid, client.to_client()

    def fit(self, ins, timeout=None, group_id=None):
        return self.client.fit(ins)


class _CM:
    def __init__(self, proxies):
        self.proxies = proxies

    def num_available(self):
        return len(self.proxies)

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return list(self.proxies)


def _setup(template, shards, tmp_path, kinds, cfg, known=None):
    data = data_index(shards[: len(kinds)] if known is None else known)
    strategy = DkStrategy(template, workdir=tmp_path, data_for=data.get, min_clients=len(kinds))
    verifier = RoundVerifier(template, key=SigningKey(b"\x09" * 32), data_for=data.get, samples=2)
    proxies = [
        _Proxy(
            f"p{i}",
            DkClient(
                template,
                data_path=shards[i],
                key=SigningKey(bytes([i + 1]) * 32),
                workdir=tmp_path / "clients",
                name=f"c{i}",
                behaviour=k,
            ),
        )
        for i, k in enumerate(kinds)
    ]
    server = SecAggFlowerServer(
        strategy=strategy, verifier=verifier, config=cfg, client_manager=_CM(proxies)
    )
    server.parameters = strategy.initial_parameters
    return server, strategy, proxies


def _plain_updates(template, shards, tmp_path, params, r, idx):
    """What honest clients would have sent in the clear (same round job, same training)."""
    out = []
    for i in idx:
        c = DkClient(
            template,
            data_path=shards[i],
            key=SigningKey(bytes([i + 1]) * 32),
            workdir=tmp_path / "plain",
            name=f"c{i}",
        )
        w = c.fit(params, {"round": r})[0]
        out.append(
            np.concatenate(
                [(a.astype(np.float64) - g).reshape(-1) for a, g in zip(w, params, strict=True)]
            )
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("plus", [False, True])
def test_secure_round_sums_only_verified_updates(template, shards, tmp_path, plus):
    # c1 proves one update and masks another; c3 goes silent while masking (a dropout). On
    # SecAgg+'s ring (k = 2, neighbourhoods of 3, t = 2) c1 honest, so that every
    # neighbourhood of the random graph keeps t survivors.
    kinds = ["honest", "honest" if plus else "mismatch", "honest", "drop"]
    cfg = SecAggConfig(plus=plus, degree=2 if plus else None, threshold=2)
    server, strategy, _ = _setup(template, shards, tmp_path, kinds, cfg)
    g0 = parameters_to_ndarrays(server.parameters)
    res = server.fit_round(1, None)
    assert res is not None
    rep = strategy.reports[-1]
    assert rep["aggregator"] == ("secagg+" if plus else "secagg"), rep
    honest = [0, 1, 2] if plus else [0, 2]
    assert rep["accepted"] == [f"c{i}" for i in honest], rep
    assert [(x["client"], x["codes"]) for x in rep["rejected"]] == (
        [] if plus else [("c1", ["MASKED_INPUT_MISMATCH"])]
    )
    assert rep["dropped"] == ["c3"] and rep["failures"] == 1
    ups = _plain_updates(template, shards, tmp_path, g0, 1, honest)
    total = np.zeros(ups[0].size, dtype=np.uint64)
    for u in ups:
        total = (total + quantize(u, scale=cfg.scale, clip=cfg.clip, n=4)) % np.uint64(P)
    want = np.concatenate([g.reshape(-1) for g in g0]).astype(np.float64)
    want = (want + dequantize(total, scale=cfg.scale) / len(honest)).astype(np.float32)
    got = np.concatenate([w.reshape(-1) for w in parameters_to_ndarrays(res[0])])
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_unverified_clients_never_enter_and_too_few_fail_cleanly(template, shards, tmp_path):
    # The verifier has no copy of c2's data: c2 is not admitted; with t = 3, 2 admitted clients
    # are too few, the round fails cleanly and the weights stay.
    cfg = SecAggConfig(threshold=3)
    server, strategy, _ = _setup(
        template, shards, tmp_path, ["honest", "honest", "honest"], cfg, known=shards[:2]
    )
    assert server.fit_round(1, None) is None
    rep = strategy.reports[-1]
    assert [(x["client"], x["codes"]) for x in rep["rejected"]] == [("c2", ["DATA_UNAVAILABLE"])]
    assert rep["error"].endswith("needed") and rep["accepted"] == []


def test_messages_round_trip_and_refuse_garbage():
    adv = {0: Advert(b"a" * 32, b"b" * 32), 3: Advert(b"c" * 32, b"d" * 32)}
    assert unpack_adverts(pack_adverts(adv), 4) == adv
    blobs = {1: b"xyz", 2: b""}
    assert unpack_blobs(pack_blobs(blobs), 4) == blobs
    assert unpack_indices(pack_indices([3, 1]), 4) == {1, 3}
    for bad in (b"", pack_adverts(adv)[:-1], pack_adverts(adv) + b"\0", pack_indices([5])):
        with pytest.raises(SecAggError):
            unpack_adverts(bad, 4) if bad[:4] != b"\0\0\0\1" else unpack_indices(bad, 4)
    with pytest.raises(SecAggError):  # indices out of order
        unpack_indices(b"\0\0\0\2\0\0\0\2\0\0\0\1", 4)
    with pytest.raises(SecAggError):  # an oversized entry
        unpack_blobs(pack_blobs({0: b"x" * 1000}), 4)


@pytest.mark.slow
def test_admission_from_an_untrusted_verifier_is_refused(template, shards, tmp_path):
    server, strategy, _ = _setup(
        template, shards, tmp_path, ["honest", "honest"], SecAggConfig(threshold=2)
    )
    server.trusted = SigningKey(b"\x0a" * 32).verify_key  # not the key the verifier signs with
    assert server.fit_round(1, None) is None
    rep = strategy.reports[-1]
    assert [x["codes"] for x in rep["rejected"]] == [["ADMISSION_INVALID"]] * 2
    assert rep["error"].endswith("needed")
