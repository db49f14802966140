"""Exit codes come from the library (dk.errors, Report.exit_code): one per outcome of a
verification (0 accept, 1 reject, 5 inconclusive) and one per error class."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from tests.helpers import WORKER, make_bundle, tiny_job

from dk.cli.app import cli, main
from dk.errors import (
    BackendUnavailable,
    DkError,
    EscrowStateError,
    ExitCode,
    FormatError,
    UsageError,
    VerificationFailed,
    exit_code_for,
)
from dk.pol.data import load_dataset
from dk.verifier import Report
from dk.verifier.report import Reason

BEACON = "ab" * 32


def dk(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)


def _report(code: Reason) -> Report:
    r = Report()
    r.fail("x", code, "m")
    return r


@pytest.mark.parametrize(
    "exc, code",
    [
        (FormatError("bad"), ExitCode.MALFORMED),
        (BackendUnavailable("no ezkl"), ExitCode.BACKEND_MISSING),
        (EscrowStateError("refused"), ExitCode.REJECTED),
        (VerificationFailed("r", report=_report(Reason.REPLAY_MISMATCH)), ExitCode.REJECTED),
        (VerificationFailed("i", report=_report(Reason.DATA_UNAVAILABLE)), ExitCode.INCONCLUSIVE),
        (DkError("other"), ExitCode.MALFORMED),
        (FileExistsError("x"), ExitCode.USAGE),
        (UsageError("x"), ExitCode.USAGE),
        (FileNotFoundError("x"), ExitCode.MALFORMED),
        (PermissionError("x"), ExitCode.MALFORMED),
        (RuntimeError("bug"), ExitCode.INTERNAL),
    ],
)
def test_each_error_class_has_its_code(exc: BaseException, code: ExitCode) -> None:
    assert exit_code_for(exc) == code


@pytest.mark.parametrize(
    "exc, code",
    [
        (VerificationFailed("REPLAY_MISMATCH: x", report=_report(Reason.REPLAY_MISMATCH)), 1),
        (VerificationFailed("DATA_UNAVAILABLE: x", report=_report(Reason.DATA_UNAVAILABLE)), 5),
        (BackendUnavailable("pip install 'dk-pol[zk]'"), 4),
        (EscrowStateError("order is settled"), 1),
    ],
)
def test_main_maps_library_errors(
    exc: BaseException,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: every DkError became exit 3."""

    def boom(path: object) -> None:
        raise exc

    monkeypatch.setattr("dk.pol.job.load_job", boom)
    job = tmp_path / "job.toml"
    job.write_text("")
    with pytest.raises(SystemExit) as ei:
        main(["job", "show", str(job)])
    assert ei.value.code == code
    err = capsys.readouterr().err
    assert err.startswith("dk: error: ") and len(err.strip().splitlines()) == 1


def test_report_exit_codes() -> None:
    ok = Report()
    ok.passed("manifest")
    assert ok.exit_code == 0
    assert _report(Reason.COMMITMENT_MISMATCH).exit_code == 1
    assert _report(Reason.BACKEND_UNAVAILABLE).exit_code == 5
    both = _report(Reason.INTERNAL_ERROR)
    both.fail("replay", Reason.REPLAY_MISMATCH, "interval 2")
    assert both.verdict == "reject" and both.exit_code == 1  # reject wins (SPEC §14.1)


@pytest.fixture(scope="module")
def npz(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("npz")
    d = load_dataset(tiny_job())
    np.savez(tmp / "data.npz", X=d.X[:300], y=d.y[:300])
    job = tiny_job(dataset="npz", data_path="data.npz", base_dir=tmp)
    (tmp / "job.toml").write_text(job.to_toml())
    make_bundle(tmp, job, WORKER)
    return tmp / "job.toml", tmp / "bundle", tmp / "data.npz"


def test_verify_data_points_at_the_verifiers_copy(
    npz: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    job, bundle, data = npz
    r = dk("verify", bundle, "--job", job, "--beacon", BEACON, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["figures"]["integrity"] == "challenged"  # the default
    mine = tmp_path / "mine.npz"
    shutil.copy(data, mine)
    moved = tmp_path / "job.toml"
    moved.write_text(job.read_text())  # the job's data.path no longer resolves from here
    r = dk("verify", bundle, "--job", moved, "--beacon", BEACON, "--json")
    assert r.exit_code == 5 and json.loads(r.output)["reasons"] == ["DATA_UNAVAILABLE"]
    r = dk("verify", bundle, "--job", moved, "--data", mine, "--beacon", BEACON)
    assert r.exit_code == 0 and "ACCEPT" in r.output, r.output
    with np.load(data) as z:
        np.savez(mine, X=z["X"][::-1], y=z["y"][::-1])
    r = dk("verify", bundle, "--job", moved, "--data", mine, "--beacon", BEACON)
    assert r.exit_code == 5 and "INCONCLUSIVE" in r.output and "DATA_UNAVAILABLE" in r.output
    r = dk("verify", bundle, "--job", moved, "--data", mine, "--integrity", "all", "--json")
    assert json.loads(r.output)["verdict"] == "inconclusive"


def test_one_line_errors_gives_the_cli_s_line_and_code(capsys: pytest.CaptureFixture[str]) -> None:
    """The examples' scripts wrap their roles in ``one_line_errors``: a dk error is one stderr
    line and ``dk``'s exit code; anything else keeps its traceback (a bug should show one)."""
    from dk.errors import JobMismatch, one_line_errors

    with pytest.raises(SystemExit) as ex, one_line_errors():
        raise JobMismatch("optimizer is SGD, the job says adamw")
    assert ex.value.code == exit_code_for(JobMismatch("x")) == 3
    assert capsys.readouterr().err == "error: optimizer is SGD, the job says adamw\n"
    with pytest.raises(KeyError), one_line_errors():
        raise KeyError("a bug")
