"""The core ``dk`` commands through click's runner, on one tiny job trained once per module,
and the real console script for exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dk.cli.app import cli
from dk.errors import FormatError
from dk.pol.job import load_job

TINY = ["--hidden", "8", "--steps", "20", "--interval", "5", "--batch-size", "16"]
BEACON = "ab" * 32


def dk(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keygen → job init → train → prove, each checked for exit 0."""
    d = tmp_path_factory.mktemp("cli")
    for args in (
        ("keygen", "--out", d / "worker.key"),
        ("job", "init", *TINY, "--out", d / "job.toml"),
        ("train", d / "job.toml", "--out", d / "run"),
        (
            "prove",
            d / "run",
            "--job",
            d / "job.toml",
            "--key",
            d / "worker.key",
            "--out",
            d / "bundle",
        ),
    ):
        r = dk(*args)
        assert r.exit_code == 0, (args, r.output, r.exception)
    return d


def test_help_lists_the_commands() -> None:
    r = dk("--help")
    assert r.exit_code == 0
    for name in ("keygen", "job", "train", "prove", "verify", "calibrate", "vectors"):
        assert f"  {name}" in r.output
    assert "Exit codes" in r.output
    assert dk("job", "--help").exit_code == 0 and "init" in dk("job", "--help").output
    assert dk("no-such-command").exit_code == 2


def test_keygen(tmp_path: Path) -> None:
    r = dk("keygen", "--out", tmp_path / "k", "--json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    assert (tmp_path / "k.pub").read_text().strip().endswith(d["public_key"])
    again = dk("keygen", "--out", tmp_path / "k")
    assert again.exit_code != 0 and isinstance(again.exception, FileExistsError)
    assert dk("keygen").exit_code == 2  # --out is required


def test_job_init_defaults_force_and_existing(tmp_path: Path) -> None:
    out = tmp_path / "job.toml"
    r = dk("job", "init", "--out", out)
    assert r.exit_code == 0, r.output
    job = load_job(out)
    assert job.job_id.hex() in r.output
    assert (job.steps, job.interval, job.model["hidden"], job.mode) == (300, 10, [64], "exact")
    assert job.data["root"] and job.pol["init_root"]
    text = out.read_text()
    r = dk("job", "init", "--steps", "5", "--out", out)
    assert r.exit_code == 2 and "exists" in r.output and "--force" in r.output
    assert out.read_text() == text
    r = dk("job", "init", "--steps", "5", "--interval", "5", "--force", "--out", out)
    assert r.exit_code == 0 and load_job(out).steps == 5


@pytest.mark.parametrize(
    "args",
    [
        ("--model", "resnet"),
        ("--steps", "0"),
        ("--mode", "trust"),
        ("--hidden", "8,x"),
        ("--seed", "-1"),
    ],
)
def test_job_init_usage_errors(args: tuple[str, ...], tmp_path: Path) -> None:
    r = dk("job", "init", *args, "--out", tmp_path / "job.toml")
    assert r.exit_code == 2
    assert not (tmp_path / "job.toml").exists()


def test_job_init_options(tmp_path: Path) -> None:
    key = "cd" * 32
    r = dk(
        "job",
        "init",
        "--model",
        "linear",
        "--optimizer",
        "adam",
        "--mode",
        "tolerant",
        "--tolerance",
        "0.01",
        "--worker",
        key,
        "--seed",
        "3",
        "--json",
        "--out",
        tmp_path / "j.toml",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    job = load_job(tmp_path / "j.toml")
    assert d["job_id"] == job.job_id.hex() and d["spec"] == job.spec
    assert job.pol["worker"] == key and job.pol["tolerance"] == 0.01 and job.train["lr"] == 1e-3
    assert job.seed == 3 and job.model["arch"] == "linear"


def test_job_show(work: Path) -> None:
    r = dk("job", "show", work / "job.toml", "--json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    job = load_job(work / "job.toml")
    assert d["job_id"] == job.job_id.hex() and d["spec"] == job.spec
    human = dk("job", "show", work / "job.toml")
    assert human.exit_code == 0 and job.job_id.hex() in human.output and "[train]" in human.output
    assert dk("job", "show", work / "nope.toml").exit_code == 2  # click: path must exist


def test_job_show_malformed(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[model]\ninput_dim = 64\noutput_dim = 10\n[train]\nsteps = -3\n")
    r = dk("job", "show", p)
    assert isinstance(r.exception, FormatError) and "steps" in str(r.exception)


def test_train_refuses_an_existing_run(work: Path) -> None:
    r = dk("train", work / "job.toml", "--out", work / "run")
    assert r.exit_code == 2 and "already holds a run" in r.output


def test_prove_refuses_an_existing_bundle(work: Path) -> None:
    r = dk(
        "prove",
        work / "run",
        "--job",
        work / "job.toml",
        "--key",
        work / "worker.key",
        "--out",
        work / "bundle",
    )
    assert isinstance(r.exception, FileExistsError)
    r = dk(
        "prove",
        work / "run",
        "--job",
        work / "job.toml",
        "--key",
        work / "worker.key",
        "--out",
        work / "b2",
        "--zk",
    )
    assert r.exit_code == 2 and "--respond" in r.output


def test_verify_accepts(work: Path) -> None:
    r = dk("verify", work / "bundle", "--job", work / "job.toml", "--beacon", BEACON)
    assert r.exit_code == 0, r.output
    assert "ACCEPT" in r.output and "detection probability" in r.output
    r = dk("verify", work / "bundle", "--job", work / "job.toml", "--beacon", BEACON, "--json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["ok"] is True and d["verdict"] == "accept" and d["beacon"] == BEACON
    assert d["checks"]["replay"] == "pass" and len(d["digest"]) == 64
    pub = (work / "worker.key.pub").read_text().strip().split(":")[1]
    r = dk(
        "verify",
        work / "bundle",
        "--job",
        work / "job.toml",
        "--worker",
        pub,
        "--samples",
        "0",
        "--json",
    )
    assert r.exit_code == 0 and json.loads(r.output)["worker_key"] == pub


def test_verify_rejects_a_tampered_bundle(work: Path, tmp_path: Path) -> None:
    b = tmp_path / "b"
    shutil.copytree(work / "bundle", b)
    blob = sorted((b / "blobs").iterdir())[0]
    data = bytearray(blob.read_bytes())
    data[-3] ^= 1
    blob.write_bytes(bytes(data))
    r = dk("verify", b, "--job", work / "job.toml", "--beacon", BEACON)
    assert r.exit_code == 1 and "REJECT" in r.output and "COMMITMENT_MISMATCH" in r.output
    r = dk("verify", b, "--job", work / "job.toml", "--beacon", BEACON, "--json")
    assert r.exit_code == 1 and json.loads(r.output)["reasons"] == ["COMMITMENT_MISMATCH"]


def test_verify_prints_bundle_text_verbatim(work: Path, tmp_path: Path) -> None:
    """A finding quotes the bundle's blob name; rich markup in it must neither crash nor vanish."""
    from vectors.gen.forge import Forgery

    from dk.crypto.keys import load_signing_key

    f = Forgery(work / "bundle", tmp_path / "b")
    f.m["checkpoints"][2]["blob"] = "[/x][bold]blob"
    forged = f.commit(load_signing_key(work / "worker.key"))
    r = dk("verify", forged, "--job", work / "job.toml", "--beacon", BEACON)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert "BAD_PATH" in r.output and "[/x][bold]blob" in r.output


def test_verify_bad_input(work: Path, tmp_path: Path) -> None:
    job = work / "job.toml"
    r = dk("verify", tmp_path / "missing", "--job", job, "--json")  # the verifier's own mistake
    assert r.exit_code == 5 and json.loads(r.output)["reasons"] == ["BUNDLE_NOT_FOUND"]
    assert json.loads(r.output)["verdict"] == "inconclusive"
    (tmp_path / "empty").mkdir()  # the worker's bundle has no manifest: its evidence is wrong
    assert dk("verify", tmp_path / "empty", "--job", job).exit_code == 1
    for beacon in ("zz" * 32, "ab" * 31, "ab" * 33, ""):
        r = dk("verify", work / "bundle", "--job", job, "--beacon", beacon)
        assert r.exit_code == 2 and "64 hex characters" in r.output, beacon
    assert dk("verify", work / "bundle", "--job", job, "--workers", "0").exit_code == 2
    assert dk("verify", work / "bundle", "--job", job, "--detect", "1.5").exit_code == 2


def test_calibrate_json(work: Path) -> None:
    r = dk("calibrate", work / "job.toml", "--intervals", "1", "--threads", "1,2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert len(d["rows"]) == 2 and d["recommended_tolerance"] >= 1e-6
    for bad in ("one", "0", "1,-2", ""):
        r = dk("calibrate", work / "job.toml", "--threads", bad)
        assert r.exit_code == 2 and "--threads" in r.output, (bad, r.output, r.exception)


def test_console_script_exit_codes_and_one_line_errors(work: Path, tmp_path: Path) -> None:
    exe = shutil.which("dk", path=str(Path(sys.executable).parent)) or shutil.which("dk")
    assert exe, "the dk console script is not installed"
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\narch = 'transformer'\n")
    narrow = tmp_path / "narrow.toml"  # a hand-edited job whose model does not fit its data
    narrow.write_text((work / "job.toml").read_text().replace("output_dim = 10", "output_dim = 5"))
    cases = [
        (["train", str(narrow), "--out", str(tmp_path / "run")], 3),
        (["job", "show", str(bad)], 3),
        (["verify", str(tmp_path / "missing"), "--job", str(work / "job.toml")], 5),
        (["keygen", "--out", str(work / "worker.key")], 2),
        (["verify", str(work / "bundle"), "--job", str(work / "job.toml"), "--beacon", "xyz"], 2),
    ]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    for args, code in cases:
        p = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == code, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        if args[0] in (
            "job",
            "keygen",
            "train",
        ):  # library errors: exactly "dk: error: ..." on one line
            assert len(p.stderr.strip().splitlines()) == 1, p.stderr
            assert p.stderr.startswith("dk: error: ")
    ok = subprocess.run(
        [exe, "job", "show", str(work / "job.toml"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (
        ok.returncode == 0
        and json.loads(ok.stdout)["job_id"] == load_job(work / "job.toml").job_id.hex()
    )


def test_npz_job_through_the_cli(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "d.npz", X=rng.standard_normal((40, 6)).astype(np.float32), y=np.arange(40) % 4)
    job = tmp_path / "job.toml"
    r = dk(
        "job",
        "init",
        "--model",
        "linear",
        "--dataset",
        data / "d.npz",
        "--steps",
        "4",
        "--interval",
        "2",
        "--batch-size",
        "8",
        "--out",
        job,
    )
    assert r.exit_code == 0, (r.output, r.exception)
    spec = load_job(job)
    assert (
        spec.data["path"] == "data/d.npz"
        and spec.model["input_dim"] == 6
        and spec.model["output_dim"] == 4
    )
    for args in (
        ("keygen", "--out", tmp_path / "k"),
        ("train", job, "--out", tmp_path / "run", "--json"),
        (
            "prove",
            tmp_path / "run",
            "--job",
            job,
            "--key",
            tmp_path / "k",
            "--out",
            tmp_path / "b",
            "--json",
        ),
        ("verify", tmp_path / "b", "--job", job, "--beacon", BEACON, "--json"),
    ):
        r = dk(*args)
        assert r.exit_code == 0, (args, r.output, r.exception)
    assert json.loads(r.output)["challenged"] == [0, 1]
    r = dk("job", "init", "--dataset", tmp_path / "missing.npz", "--out", tmp_path / "j2.toml")
    assert isinstance(r.exception, FormatError) and "not found" in str(r.exception)


def test_prove_refuses_an_incomplete_run(work: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(work / "run", run)
    (run / "run.json").unlink()
    r = dk(
        "prove",
        run,
        "--job",
        work / "job.toml",
        "--key",
        work / "worker.key",
        "--out",
        tmp_path / "b",
    )
    assert isinstance(r.exception, FormatError) and "incomplete" in str(r.exception)


def test_paths_with_brackets_are_printed_verbatim(tmp_path: Path) -> None:
    """File names are not rich markup: "[bold]" must not vanish from the message."""
    key, job = tmp_path / "[bold]key", tmp_path / "[red]job.toml"
    r = dk("keygen", "--out", key)
    assert r.exit_code == 0 and isinstance(r.exception, (type(None), SystemExit)), r.exception
    assert str(key) in r.output
    r = dk("job", "init", *TINY, "--out", job)
    assert r.exit_code == 0 and str(job) in r.output, (r.output, r.exception)


def test_train_draws_its_bar_on_a_terminal_without_a_refresh_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal ``dk train`` draws a progress bar from the training callback itself: no
    refresh thread runs beside training to take the GIL from it (dk.pol.writer's docstring)."""
    import pty
    import threading
    from types import SimpleNamespace

    import dk.prover as prover

    assert dk("job", "init", *TINY, "--out", tmp_path / "job.toml").exit_code == 0
    before = set(threading.enumerate())
    extra: list[set[threading.Thread]] = []

    def fake_train(spec: object, out: str, progress: object = None, resume: bool = False) -> object:
        assert callable(progress)
        for step in range(1, 21):
            progress(step)
            extra.append(set(threading.enumerate()) - before)
        return SimpleNamespace(steps=20, checkpoints=[])

    monkeypatch.setattr(prover, "train", fake_train)
    monkeypatch.setenv("TERM", "xterm")  # rich draws nothing on a dumb terminal
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    master, slave = pty.openpty()
    drawn = b""
    try:
        with open(slave, "w", encoding="utf-8", closefd=True) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            try:
                cli.main(["train", str(tmp_path / "job.toml"), "--out", str(tmp_path / "run")],
                         standalone_mode=False)  # fmt: skip
            finally:
                monkeypatch.undo()
        os.set_blocking(master, False)
        try:
            while chunk := os.read(master, 65536):
                drawn += chunk
        except (BlockingIOError, OSError):  # drained (EAGAIN), or EIO once the slave closed
            pass
    finally:
        os.close(master)
    assert b"training" in drawn and b"10/20" in drawn  # drawn by each call, not only at the end
    assert len(extra) == 20 and not any(extra)  # and no thread ran beside training
