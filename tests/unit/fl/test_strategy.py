"""The PoL gate and the Flower strategy, in process (SPEC §VII.1): only verified updates count."""

from __future__ import annotations

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.common import (  # noqa: E402
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from dk.crypto.keys import SigningKey  # noqa: E402
from dk.fl.client import DkClient  # noqa: E402
from dk.fl.run import data_index  # noqa: E402
from dk.fl.strategy import DkStrategy  # noqa: E402


def _round(strategy, clients, r, params):
    class _CM:  # the part of Flower's ClientManager that configure_fit uses
        def num_available(self):
            return len(clients)

        def sample(self, num_clients, min_num_clients=None, criterion=None):
            return list(range(num_clients))

    strategy.configure_fit(r, params, _CM())
    res = []
    for c in clients:
        out, n, m = c.fit(parameters_to_ndarrays(params), {"round": r})
        res.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(out), n, m)))
    return strategy.aggregate_fit(r, res, [])[0]


@pytest.mark.slow
def test_only_verified_updates_are_aggregated(template, shards, tmp_path):
    known = data_index(shards[:3])  # the coordinator has no copy of client 3's data
    strategy = DkStrategy(template, workdir=tmp_path, data_for=known.get, beacon=lambda: bytes(32))
    kinds = ["honest", "lazy", "mismatch", "honest"]
    clients = [
        DkClient(
            template,
            data_path=shards[i],
            key=SigningKey(bytes([i + 1]) * 32),
            workdir=tmp_path / "clients",
            name=f"c{i}",
            behaviour=k,
        )
        for i, k in enumerate(kinds)
    ]
    p1 = _round(strategy, clients, 1, strategy.initial_parameters)
    rep = strategy.reports[-1]
    assert rep["accepted"] == ["c0", "c1"]  # the lazy client trains in its first round
    assert {x["client"]: x["codes"] for x in rep["rejected"]} == {
        "c2": ["UPDATE_MISMATCH"],
        "c3": ["DATA_UNAVAILABLE"],
    }
    _round(strategy, clients, 2, p1)
    rep = strategy.reports[-1]
    assert rep["accepted"] == ["c0"]
    codes = {x["client"]: x["codes"] for x in rep["rejected"]}
    assert codes["c1"] == ["JOB_MISMATCH"]  # its round-1 bundle answers another round's job
    # With one verified update, FedAvg's new global weights are exactly that client's.
    honest = clients[0].fit(parameters_to_ndarrays(p1), {"round": 2})[0]
    for a, b in zip(strategy.global_weights, honest, strict=True):
        np.testing.assert_array_equal(a, b)


def test_missing_or_garbage_bundle_is_rejected(template, shards, tmp_path):
    strategy = DkStrategy(template, workdir=tmp_path, data_for=data_index(shards).get)

    class _CM:
        def num_available(self):
            return 2

        def sample(self, num_clients, min_num_clients=None, criterion=None):
            return list(range(num_clients))

    params = strategy.initial_parameters
    strategy.configure_fit(1, params, _CM())
    root = data_index(shards[:1]).popitem()[0]
    arrays = parameters_to_ndarrays(params)
    res = [
        (None, FitRes(Status(Code.OK, ""), params, 10, {"client": "a", "data_root": root})),
        (
            None,
            FitRes(
                Status(Code.OK, ""),
                params,
                10,
                {"client": "b", "data_root": root, "bundle": b"DKB1garbage"},
            ),
        ),
        (
            None,
            FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays[:1]), 10, {"client": "c"}),
        ),
    ]
    out, _ = strategy.aggregate_fit(1, res, [])
    codes = {x["client"]: x["codes"] for x in strategy.reports[-1]["rejected"]}
    assert codes == {"a": ["BUNDLE_MISSING"], "b": ["BUNDLE_MALFORMED"], "c": ["UPDATE_MALFORMED"]}
    for a, b in zip(parameters_to_ndarrays(out), arrays, strict=True):  # nothing aggregated
        np.testing.assert_array_equal(a, b)
