"""Kernels loaded from Numba's cache without Numba's registries (a verifier's fixed cost,
issue 11 §4) compute the same bits as kernels compiled or loaded the usual way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._exact_cases import CASES, TINY, digest, run

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import sys
from tests.unit.exact._exact_cases import CASES, TINY, digest, run
import dk.pol.exact._cpu as K
for name, case in {**CASES, **TINY}.items():
    print(name, digest(run(case, 3, 16, seed=5)))
print("switched", K.LIGHT_CACHE_LOADS)
print("registries", "numba.np.arraymath" in sys.modules or "numba.typed.typeddict" in sys.modules)
"""


def _child() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return dict(line.split() for line in out.stdout.strip().splitlines())


def test_cached_kernels_load_without_registries_and_give_the_same_bits() -> None:
    first = _child()  # compiles whatever is not cached yet (then the registries load)
    second = _child()  # every kernel now comes from the cache
    assert int(second.pop("switched")) >= 20
    assert second.pop("registries") == "False"  # the light load ran; the registries never did
    first.pop("switched"), first.pop("registries")
    here = {name: digest(run(case, 3, 16, seed=5)) for name, case in {**CASES, **TINY}.items()}
    assert second == first == here
    assert len(set(here.values())) == len(here)  # the digests tell the cases apart
