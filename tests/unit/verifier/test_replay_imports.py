"""An exact replay on dk's kernels imports neither torch nor SciPy's linear algebra nor CFFI
nor Numba's registries (issue 11 §4: the fixed cost of a verifier process; the kernels load
from Numba's cache, ``dk.pol.exact._numba_load``), and still judges: an honest bundle is
accepted, a skipped interval rejected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import WORKER, make_bundle
from vectors.gen.forge import FORGERIES, Forgery

ROOT = Path(__file__).resolve().parents[3]
CODE = """
import sys
if sys.argv[3] == "numba-first":
    import numba  # imports the top-level scipy package (light); scipy.linalg is the heavy part
from dk.verifier import verify_bundle
r = verify_bundle(sys.argv[1], sys.argv[2], beacon=bytes(32), samples=1000, topq=0)
print(r.verdict, r.figures["replayed_intervals"], "scipy.linalg" in sys.modules,
      "torch" in sys.modules, "cffi" in sys.modules, "numba.np.arraymath" in sys.modules)
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("imports")
    job, honest = make_bundle(tmp)
    (tmp / "job.toml").write_text(job.to_toml())
    forge, _ = FORGERIES["skipped-interval"]
    return tmp / "job.toml", honest, forge(Forgery(honest, tmp / "skip"), WORKER)


def _verify(bundle: Path, job: Path, first: str = "-") -> list[str]:
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CODE, str(bundle), str(job), first],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return out.stdout.split()


def test_exact_replay_imports_neither_torch_nor_scipy(bundles: tuple[Path, Path, Path]) -> None:
    """...nor CFFI nor Numba's registries (the last figure), once the kernels are cached."""
    job, honest, skipped = bundles
    assert _verify(honest, job)[:2] == ["accept", "4"]  # compiles what is not cached yet
    assert _verify(honest, job) == ["accept", "4", "False", "False", "False", "False"]
    assert _verify(skipped, job) == ["reject", "4", "False", "False", "False", "False"]
    want = ["accept", "4", "False", "False", "False", "False"]
    assert _verify(honest, job, "numba-first") == want
