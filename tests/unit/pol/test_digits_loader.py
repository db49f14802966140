"""The built-in ``digits`` data is read from scikit-learn's bundled CSV without importing
scikit-learn, and is exactly what scikit-learn's ``load_digits`` gives (SPEC §7.2)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from dk.pol.data.arrays import load_digits


def test_digits_equal_scikit_learns() -> None:
    from sklearn.datasets import load_digits as sk_load

    d = sk_load()
    ds = load_digits()
    want = (np.asarray(d.data, dtype=np.float64) / 16.0).astype(np.float32)
    assert ds.X.tobytes() == want.tobytes() and ds.X.shape == (1797, 64)
    assert ds.y.tobytes() == np.asarray(d.target, dtype=np.int64).tobytes()


def test_digits_do_not_import_scikit_learn() -> None:
    code = (
        "import sys; from dk.pol.data.arrays import load_digits; load_digits(); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
