"""``make demo``'s market part: a real ``dk market serve`` and every party its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from dk.crypto.keys import SigningKey
from dk.market.demo_server import run_served_demo

WORKER_SEED = bytes([7]) * 32


@pytest.fixture(scope="module")
def proved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A small digits job, its honest bundle, and the worker's key file that signed it."""
    from dk.pol import default_job
    from dk.pol.train import train_job
    from dk.prover import prove_run

    d = tmp_path_factory.mktemp("served-demo")
    job = default_job(steps=40, interval=10, base_dir=d)
    (d / "job.toml").write_text(job.to_toml())
    key = SigningKey(WORKER_SEED)
    key.save(d / "worker.key")
    train_job(job, d / "run")
    prove_run(d / "run", job, key, d / "bundle")
    return d / "job.toml", d / "bundle", d / "worker.key"


@pytest.mark.slow
def test_served_demo_end_to_end(proved: tuple[Path, Path, Path], tmp_path: Path) -> None:
    job_path, bundle, worker_key = proved
    lines: list[str] = []
    assert run_served_demo(bundle, job_path, tmp_path / "m", lines.append, worker_key=worker_key)
    text = "\n".join(lines)
    assert "listening on http://127.0.0.1:" in text
    assert "the server verifies its own copy: accept" in text
    assert "released; worker balance 1100, consumer 900" in text  # 1000 - 120 + 20 refund
    assert "samples 4 of m = 4 (economic default, fixed at verification)" in text
    assert any("audit --url: clean" in line for line in lines)
    assert lines[-1] == "market: server stopped with SIGTERM"
    for party in ("consumer", "val-1", "val-2", "val-3", "val-4"):
        assert (tmp_path / "m" / f"{party}.key").is_file()  # each party its own key file
    # the server's ledger is a system-clock ledger: a test clock would refuse nothing
    from dk.market.market import Market

    with Market(tmp_path / "m" / "market.db") as m:
        assert m.config.clock == "system"
        assert m.audit(check_bls=False).ok


def test_served_demo_needs_the_workers_key(proved: tuple[Path, Path, Path], tmp_path: Path) -> None:
    job_path, bundle, _ = proved
    lines: list[str] = []
    assert not run_served_demo(
        bundle, job_path, tmp_path, lines.append, worker_key=tmp_path / "absent.key"
    )
    assert lines == [f"market: FAILED: no worker key {tmp_path / 'absent.key'}"]
    assert not (tmp_path / "market.db").exists()  # nothing was started
