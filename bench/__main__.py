"""`make bench`: run every ``bench/bench_*.py`` module's ``main()`` in one process, in order.

Each module prints its own table of figures with ratios against a baseline measured in the
same run. ``python -m bench NAME`` runs only the modules whose name contains NAME.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    failed = 0
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception as e:  # a failing benchmark must not hide the others
            failed += 1
            print(f"{name} FAILED: {type(e).__name__}: {e}", flush=True)
        print(f"({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
