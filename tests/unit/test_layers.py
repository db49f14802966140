"""Import arrows point one way (DESIGN §3): a new back-arrow fails this test.

Every ``import dk.X`` / ``from dk.X import`` in ``src/dk`` (module level or inside a function)
is an edge from the importing package to ``X``. ``compress`` is a leaf beside ``crypto``
(NumPy/Numba only) that ``pol`` uses for the codec state it commits in checkpoints.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dk"
LEAF = {"errors", "reasons"}
ALLOWED: dict[str, set[str]] = {
    "crypto": set(),
    "compress": set(),
    "pol": {"crypto", "compress"},
    "circuits": {"pol", "crypto"},
    "prover": {"circuits", "pol", "crypto", "compress"},
    "verifier": {"pol", "crypto", "circuits"},  # circuits only for zk-mode checks
    "market": {"verifier", "pol", "crypto"},  # never the prover
    "fl": {"pol", "prover", "verifier", "crypto", "compress"},
    "dist": {"pol", "prover", "crypto"},  # data-parallel ranks (SPEC §8.5)
    "integrations": {"pol"},  # Lightning / Hugging Face callbacks over the Recorder
    "vectors": {"crypto", "pol", "compress", "circuits", "prover", "verifier", "market", "fl"},
}


def package_imports() -> dict[str, set[tuple[str, str]]]:
    edges: dict[str, set[tuple[str, str]]] = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC).parts
        pkg = rel[0].removesuffix(".py")
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "dk" and len(parts) > 1 and parts[1] != pkg:
                    edges.setdefault(pkg, set()).add((parts[1], str(f.relative_to(SRC))))
    return edges


def test_no_back_arrows() -> None:
    bad = [
        f"{where} imports dk.{target}"
        for pkg, targets in package_imports().items()
        if pkg in ALLOWED
        for target, where in sorted(targets)
        if target not in ALLOWED[pkg] | LEAF
    ]
    assert bad == []


def test_the_check_sees_imports_inside_functions() -> None:
    edges = package_imports()
    assert ("pol", "verifier/verify.py") in edges["verifier"]
    assert any(t == "compress" for t, _ in edges["pol"])  # a lazy import in pol
