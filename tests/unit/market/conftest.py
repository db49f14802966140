"""Fixtures for the market tests (helpers live in market_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from market_support import World, new_market

from dk.market import Market


@pytest.fixture
def market(tmp_path: Path) -> Iterator[Market]:
    m = new_market(tmp_path / "m.db")
    yield m
    m.close()


@pytest.fixture
def world(market: Market, tmp_path: Path) -> World:
    return World(market, tmp_path)
