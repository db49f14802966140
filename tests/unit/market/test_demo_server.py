"""``make demo``'s market part: a real ``dk market serve`` and every party its own process."""

from __future__ import annotations

import re
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
    ok = run_served_demo(bundle, job_path, tmp_path / "m", lines.append, worker_key=worker_key)
    assert ok, "\n".join(lines)
    text = "\n".join(lines)
    assert "listening on http://127.0.0.1:" in text
    assert "the server verifies its own copy: accept" in text
    # worker: 1000 + price 100 - the stake 10 of its bid on the tolerant order; consumer:
    # 1000 - price 100 - the fee the verification used (22 of 22: it challenged all of the
    # tiny job's 4 intervals) - the tolerant order's escrow (60 less the match's refund of 10)
    assert "released; worker balance 1090, consumer 828" in text
    assert "samples 4 of m = 4 (economic default, fixed at verification)" in text
    # the fee escrow priced from the work estimate (SPEC V §11)
    assert "work estimate (SPEC V §11): 666 kFLOP per step × 40 steps" in text
    assert "escrow locks price 120 + fee 22" in text
    assert "the attesters are paid 22" in text and "gets back the excess, 0" in text
    # the whistleblower re-checks, then a false whistle forfeits its deposit (SPEC V §13)
    assert "(dk market recheck): accept, challenged intervals [0, 1, 2, 3], failing none" in text
    assert "whistle is false: its deposit 10 goes to the treasury" in text
    # verifier profiling: two calibrated profiles and an outlier fix the tolerance (SPEC V §12)
    assert text.count("ran dk calibrate on the job: signed profile") == 2
    # two honest calibrations (thread counts and torch's generic CPU kernels: ~2e-6 on x86-64
    # AVX2) and an outlier at 1.0: the lower median is the larger honest one
    honest = [
        float(t) for t in re.findall(r"ran dk calibrate on the job: .*tolerance ([\d.e+-]+),", text)
    ]
    median = max(honest)
    assert len(honest) == 2 and 1e-6 <= median < 1e-4, honest
    assert f"the lower median of the 3 profiles, {median:.2g};" in text
    assert "treasury: balance 20 (in by kind: match 10, resolve_whistle 10; out 0)" in text
    assert any("audit --url: clean" in line for line in lines)
    assert lines[-1] == "market: server stopped with SIGTERM"
    for party in ("consumer", "val-1", "val-2", "val-3", "val-4", "whistler"):
        assert (tmp_path / "m" / f"{party}.key").is_file()  # each party its own key file
    # the server's ledger is a system-clock ledger: a test clock would refuse nothing
    import json

    from dk.market.market import Market

    with Market(tmp_path / "m" / "market.db") as m:
        assert m.config.clock == "system"
        assert m.audit(check_bls=False).ok
        assert m.treasury()["balance"] == 20
        rows = [m.order(o["order_id"]) for o in m.book()["orders"]]
        tolerant = [r for r in rows if json.loads(r["tags"]) == {"mode": "tolerant"}]
        assert len(tolerant) == 1 and tolerant[0]["state"] == "matched"
        assert f"{json.loads(tolerant[0]['policy'])['tolerance']:.2g}" == f"{median:.2g}"


def test_served_demo_needs_the_workers_key(proved: tuple[Path, Path, Path], tmp_path: Path) -> None:
    job_path, bundle, _ = proved
    lines: list[str] = []
    assert not run_served_demo(
        bundle, job_path, tmp_path, lines.append, worker_key=tmp_path / "absent.key"
    )
    assert lines == [f"market: FAILED: no worker key {tmp_path / 'absent.key'}"]
    assert not (tmp_path / "market.db").exists()  # nothing was started
