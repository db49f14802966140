"""The callbacks sit on top (DESIGN §3): they use pol and the error tree, nothing imports them."""

from __future__ import annotations

from tests.unit.test_layers import package_imports


def test_integrations_use_only_pol() -> None:
    edges = package_imports()
    assert {t for t, _ in edges["integrations"]} <= {"pol", "errors"}
    assert not [w for targets in edges.values() for t, w in targets if t == "integrations"]
