"""An honest tiny bundle, built once per session, for the forgeries to start from."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import make_bundle


@pytest.fixture(scope="session")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    return make_bundle(tmp_path_factory.mktemp("honest"))
