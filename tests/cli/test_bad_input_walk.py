"""A new user's bad input, found by a walkthrough of every command: each is the documented
exit code with a message and no traceback (SPEC §14.1 exit codes), never exit 70, never a
verdict or a state change the input did not earn."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import make_bundle

from dk.cli.app import main

VECTORS = Path(__file__).resolve().parents[2] / "vectors"


def _dk(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, out.err
    return int(e.value.code or 0), out.err + out.out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("walk")
    job, b = make_bundle(tmp)
    (tmp / "job.toml").write_text(job.to_toml())
    return b, tmp / "job.toml"


@pytest.mark.parametrize(
    "extra",
    [["--skipped", "nan"], ["--detect", "nan"], ["--skipped", "inf"], ["--worker", "zz"]],
    ids=["skipped-nan", "detect-nan", "skipped-inf", "worker-not-hex"],
)
def test_verify_options_that_reached_the_verifier_are_usage_errors(
    bundle: tuple[Path, Path], extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--skipped nan` ended INTERNAL_ERROR (inconclusive); `--worker zz` rejected a valid
    bundle (WORKER_MISMATCH)."""
    b, job = bundle
    code, err = _dk(["verify", str(b), "--job", str(job), *extra], capsys)
    assert code == 2, err


def test_calibrate_thread_and_device_lists_are_checked(
    bundle: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--threads 100000 crashed the process (SIGSEGV); --devices gpu or '' raised in torch."""
    _, job = bundle
    for extra in (["--threads", "100000"], ["--devices", "gpu"], ["--devices", ""]):
        code, err = _dk(["calibrate", str(job), "--no-cpu-variants", *extra], capsys)
        assert code == 2, (extra, err)


def test_a_damaged_vector_file_is_a_failed_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    shutil.copytree(VECTORS / "crypto", tmp_path / "crypto")
    (tmp_path / "crypto" / "hashing.json").write_text('{"cases": 5}')
    (tmp_path / "crypto" / "merkle_root.json").write_bytes(b"\x00\xff")
    code, err = _dk(["vectors", "check", str(tmp_path)], capsys)
    assert code == 1 and "not a vector file" in err, err


def test_a_file_that_is_no_ledger_is_malformed_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "garbage.bin").write_bytes(b"\x00\x01not sqlite" * 100)
    for cmd, db in (("audit", tmp_path / "garbage.bin"), ("init", tmp_path / "no" / "m.db")):
        code, err = _dk(["market", cmd, "--db", str(db)], capsys)
        assert code == 3 and "not a market ledger" in err, err


def test_market_account_and_calibration_inputs_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _dk(
        ["market", "balance", "--db", str(tmp_path / "m.db"), "--account", "zz"], capsys
    )
    assert code == 2, err
    (tmp_path / "k").write_text("00" * 32)
    (tmp_path / "cal.json").write_text('{"tolerance": 0.1')
    args = ["market", "profile", "--db", str(tmp_path / "m.db"), "--key", str(tmp_path / "k")]
    code, err = _dk([*args, "o1", "--calibration", str(tmp_path / "cal.json")], capsys)
    assert code == 3, err


def test_compress_check_on_cuda_without_a_gpu_is_a_missing_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It raised Numba's CudaSupportError (exit 70); the suite may run Numba's simulator, so
    the test takes the device away itself."""
    from numba import config
    from numba import cuda as nb_cuda

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(nb_cuda, "is_available", lambda: False)
    code, err = _dk(["compress", "check", "--cuda", "--size", "1000"], capsys)
    assert code == 4 and "no CUDA device" in err, err


def test_a_plot_that_cannot_be_written_keeps_the_verdict(
    bundle: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--plot` into a missing directory printed ACCEPT, then exited 3: the verdict was lost."""
    b, job = bundle
    plot = tmp_path / "missing" / "p.html"
    code, err = _dk(["verify", str(b), "--job", str(job), "--plot", str(plot)], capsys)
    assert code == 0 and "no plot" in err, err
