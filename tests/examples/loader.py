"""Load an example script from ``examples/<name>/example.py`` as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """The example's module (its consumer, worker and verifier functions)."""
    path = EXAMPLES / name / "example.py"
    spec = importlib.util.spec_from_file_location(f"dk_example_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
