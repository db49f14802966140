"""Regenerate every vector area: ``python -m vectors.gen [AREA ...]``.

Each ``vectors/gen/<area>.py`` exposes ``generate(root: Path) -> None`` and writes only under
``root/<area>/``. Generation is deterministic (fixed seeds and keys), so a rerun on an
unchanged format leaves ``git diff`` empty.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from dk.vectors import AREAS

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    areas = argv or list(AREAS)
    for area in areas:
        try:
            module = importlib.import_module(f"vectors.gen.{area}")
        except ModuleNotFoundError as e:
            if e.name == f"vectors.gen.{area}":
                print(f"skip {area}: no generator yet")
                continue
            raise
        module.generate(ROOT)
        print(f"generated {area}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
