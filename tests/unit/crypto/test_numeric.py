"""Fixed-order sums (SPEC §1.4): the fold sum, and update norms that do not depend on the CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dk.crypto.numeric import fold_sum, fold_sum_inplace, model_update_norm
from dk.pol.checkpoint import update_norm

SRC = Path(__file__).resolve().parents[3] / "src"


def fold_reference(values: list[float]) -> float:
    """SPEC §1.4 written from the text, one Python float addition at a time."""
    v = [float(x) for x in values]
    n = len(v)
    if n == 0:
        return 0.0
    while n > 1:
        h = n // 2
        for i in range(h):
            v[i] = v[i] + v[n - h + i]
        n -= h
    return v[0]


def _pair(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Two float32 checkpoints whose update norm np.dot rounds differently by SIMD width."""
    rng = np.random.default_rng(seed)
    shapes = {"model/a.weight": (37, 29), "model/a.bias": (37,), "model/b": (1001,)}
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    b = {k: (v + rng.standard_normal(v.shape).astype(np.float32)) for k, v in a.items()}
    a["optim/lr"] = b["optim/lr"] = np.array(0.1)  # not model/*: ignored
    return a, b


# update_norm(*_pair(0)) as fixed by SPEC §1.4 (float.hex). Changing it is a format change.
PINNED_NORM = "0x1.6ccd867c43453p+5"


@pytest.mark.parametrize("n", [*range(0, 40), 63, 64, 65, 1000, 1001, 4097])
def test_fold_sum_follows_the_spec_text(n: int) -> None:
    rng = np.random.default_rng(n)
    v = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    assert fold_sum(v).hex() == fold_reference(v.tolist()).hex()


def test_fold_sum_order_is_the_spec_order() -> None:
    # n = 3, h = 1: (1e100 + -1e100) first, then + 1.0. Left to right (np.sum) gives 0.
    v = np.array([1e100, 1.0, -1e100])
    assert fold_sum(v) == 1.0
    assert float(np.sum(v)) == 0.0
    # n = 4, h = 2: (1 + 1) and (1e100 - 1e100), then 2 + 0.
    assert fold_sum(np.array([1.0, 1e100, 1.0, -1e100])) == 2.0


def test_fold_sum_inplace_rejects_what_it_cannot_sum() -> None:
    with pytest.raises(ValueError):
        fold_sum_inplace(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError):
        fold_sum_inplace(np.zeros((2, 2)))
    assert fold_sum(np.zeros((0,))) == 0.0
    assert math.copysign(1.0, fold_sum(np.array([-0.0]))) == -1.0  # one term: itself


def test_update_norm_matches_the_spec_text() -> None:
    a, b = _pair(0)
    names = sorted(k for k in a if k.startswith("model/"))
    squares = [
        (float(y) - float(x)) ** 2
        for k in names
        for x, y in zip(a[k].ravel().tolist(), b[k].ravel().tolist(), strict=True)
    ]
    want = math.sqrt(fold_reference(squares))
    assert update_norm(a, b).hex() == want.hex() == model_update_norm(a, b).hex()


def _run_child(coretype: str) -> dict[str, str] | None:
    code = (
        "import json, sys\n"
        f"sys.path[:0] = [{str(SRC)!r}, {str(Path(__file__).parent)!r}]\n"
        "import numpy as np\n"
        "from test_numeric import _pair\n"
        "from dk.pol.checkpoint import update_norm\n"
        "a, b = _pair(0)\n"
        "dot = 0.0\n"
        "for k in sorted(a):\n"
        "    if k.startswith('model/'):\n"
        "        d = (b[k].astype(np.float64) - a[k].astype(np.float64)).ravel()\n"
        "        dot += float(np.dot(d, d))\n"
        "print(json.dumps({'dot': float(np.sqrt(dot)).hex(), 'dk': update_norm(a, b).hex()}))\n"
    )
    env = {**os.environ, "OPENBLAS_CORETYPE": coretype, "OPENBLAS_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    if p.returncode != 0:  # e.g. a core type this CPU cannot run (illegal instruction)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_update_norm_does_not_depend_on_the_blas_kernel() -> None:
    """np.dot differs between OpenBLAS's Haswell (AVX2) and Prescott (SSE3) kernels; dk does not.

    This is the bug of issue 11: the same run gave another transcript root on an AMD EPYC.
    """
    got = {c: _run_child(c) for c in ("Haswell", "Prescott")}
    runs = {c: r for c, r in got.items() if r is not None}
    assert runs, "neither OpenBLAS core type ran"
    for r in runs.values():
        assert r["dk"] == PINNED_NORM
    assert update_norm(*_pair(0)).hex() == PINNED_NORM
    if len(runs) < 2:
        pytest.skip("only one OpenBLAS core type runs on this CPU: np.dot not compared")
    config = np.show_config(mode="dicts")
    if "openblas" not in json.dumps(config).lower():
        pytest.skip("NumPy is not built on OpenBLAS")
    assert runs["Haswell"]["dot"] != runs["Prescott"]["dot"], runs
