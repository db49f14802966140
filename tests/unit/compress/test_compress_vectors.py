"""The checked-in compress vectors pass and regenerate byte for byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dk.vectors.compress import check

ROOT = Path(__file__).resolve().parents[3] / "vectors"


def test_vectors_pass():
    results = check(ROOT)
    assert len(results) > 50 and [r for r in results if not r.ok] == []


def test_generator_is_deterministic(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_compress", ROOT / "gen" / "compress.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    for path in (ROOT / "compress").glob("*.json"):
        assert (tmp_path / "compress" / path.name).read_bytes() == path.read_bytes(), path.name
