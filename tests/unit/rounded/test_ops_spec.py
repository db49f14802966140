"""SPEC VI §1's operation lists are dk's (an outside verifier classifies from the SPEC)."""

from __future__ import annotations

import re
from pathlib import Path

from dk.pol.backends import ops

SPEC = Path(__file__).resolve().parents[3] / "SPEC.md"


def test_spec_lists_every_operation_class_as_the_code_does() -> None:
    text = SPEC.read_text(encoding="utf-8")
    block = text[text.index("<!-- ops lists: begin -->") : text.index("<!-- ops lists: end -->")]
    found = re.findall(r"^\* `([A-Z0-9_]+)` \((\d+)\): (.*)$", block, re.M)
    lists = {name: body for name, _, body in found}
    assert all(int(n) == len(getattr(ops, name)) for name, n, _ in found)
    names = {n for n in vars(ops) if n.endswith(("_OPS", "_FOREACH"))}
    assert set(lists) == names
    for name, body in lists.items():
        assert set(re.findall(r"`([A-Za-z0-9_]+)`", body)) == getattr(ops, name), name
