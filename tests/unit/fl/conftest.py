"""Shared fixtures: a tiny template job and client data shards (SPEC Part VII)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def template():
    from dk.pol import default_job

    return default_job(hidden=[8], steps=8, interval=4, batch_size=16)


@pytest.fixture(scope="module")
def shards(template, tmp_path_factory) -> list[Path]:
    from dk.pol.data import load_dataset

    ds = load_dataset(template)
    d = tmp_path_factory.mktemp("shards")
    out = []
    for i in range(4):
        p = d / f"c{i}.npz"
        np.savez(p, X=ds.X[i::4][:120], y=ds.y[i::4][:120])
        out.append(p)
    return out
