"""An interrupted ``dk train`` resumes from its last committed checkpoint with nothing lost:
the resumed run's bundle is byte-identical to an uninterrupted one (exact mode)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import WORKER, tiny_job

from dk.errors import FormatError
from dk.pol import train_job
from dk.prover import prove_run

ROOT = Path(__file__).resolve().parents[3]

# Runs training in a child process that SIGKILLs itself right after step KILL_AT (after a
# pause, so the commits before it reach the log, as they would in a long run).
CHILD = """
import os, signal, sys, time
from dk.pol import recorder, train_job
from dk.pol.job import load_job

job, run, kill_at, torn = load_job(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
orig = recorder.Recorder._on_step

def on_step(self):
    orig(self)
    if self.step == kill_at:
        time.sleep(1.0)
        if torn == "1":  # a line cut off mid-write
            with open(os.path.join(run, "run.log.jsonl"), "a") as f:
                f.write('{"checkpoint": {"index": 9')
        os.kill(os.getpid(), signal.SIGKILL)

recorder.Recorder._on_step = on_step
train_job(job, run)
"""


def _killed_run(job: Any, tmp: Path, kill_at: int, torn: bool = False) -> Path:
    (tmp / "job.toml").write_text(job.to_toml())
    run = tmp / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(tmp / "job.toml"),
            str(run),
            str(kill_at),
            str(int(torn)),
        ],
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert not (run / "run.json").exists()
    return run


def _bundle_bytes(bundle: Path) -> dict[str, bytes]:
    return {
        p.relative_to(bundle).as_posix(): p.read_bytes()
        for p in sorted(bundle.rglob("*"))
        if p.is_file()
    }


def _check_resume(
    job: Any,
    tmp: Path,
    kill_at: int,
    torn: bool = False,
    least: int = 2,
    damage: Callable[[Path], None] | None = None,
) -> int | None:
    """Kill a run after step ``kill_at``, ``damage`` it, resume it: the bundle must be an
    uninterrupted run's, byte for byte. Returns the step the run resumed from."""
    from dk.pol.recorder import Recorder
    from dk.pol.resume import has_partial_run

    train_job(job, tmp / "whole")
    whole = prove_run(tmp / "whole", job, WORKER, tmp / "whole-bundle")
    run = _killed_run(job, tmp, kill_at, torn)
    assert has_partial_run(run)
    log = (run / "run.log.jsonl").read_text().splitlines()
    committed = sum(1 for ln in log if ln.endswith("}"))
    assert least <= committed < len(job.checkpoint_steps())  # interrupted mid-run
    if damage is not None:
        damage(run)
    resumed_from: list[int | None] = []
    init = Recorder.__init__

    def spy(self: Recorder, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        resumed_from.append(self.resumed_from)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Recorder, "__init__", spy)
        info = train_job(job, run, resume=True)
    assert info.complete and len(info.checkpoints) == len(job.checkpoint_steps())
    resumed = prove_run(run, job, WORKER, tmp / "resumed-bundle")
    assert _bundle_bytes(resumed) == _bundle_bytes(whole)
    return resumed_from[0]


def test_exact_kernels_run_resumes_bit_identically(tmp_path: Path) -> None:
    _check_resume(tiny_job(steps=40, interval=5), tmp_path, kill_at=23)


def test_torn_log_line_is_dropped(tmp_path: Path) -> None:
    _check_resume(tiny_job(steps=20, interval=5), tmp_path, kill_at=12, torn=True)


@pytest.mark.slow
def test_torch_run_with_schedule_resumes_bit_identically(tmp_path: Path) -> None:
    job = tiny_job(
        steps=24,
        interval=4,
        pol={"backend": "torch"},
        train={"optimizer": "adamw", "schedule": "cosine", "warmup_steps": 3, "lr": 0.01},
    )
    _check_resume(job, tmp_path, kill_at=14)


@pytest.mark.slow
@pytest.mark.parametrize(("kill_at", "least"), [(14, 2), (2, 1)])
def test_rounded_run_resumes_bit_identically(tmp_path: Path, kill_at: int, least: int) -> None:
    """SPEC VI: the committed intervals' rounding logs are found again in ``logs/`` and kept,
    the interrupted interval is recorded afresh; the bundle, logs included, is byte for byte an
    uninterrupted run's. Killed mid-run, and before checkpoint 1 (the first interval's
    self-check then replays from the resumed checkpoint 0)."""
    job = tiny_job(steps=16, interval=4, pol={"backend": "rounded"})
    _check_resume(job, tmp_path, kill_at=kill_at, least=least)
    assert len(list((tmp_path / "run" / "logs").glob("*.dkrl"))) == 4


def _log_of(run: Path, interval: int) -> Path:
    from dk.pol.backends.log import decode_log

    return next(
        p for p in (run / "logs").glob("*.dkrl") if decode_log(p.read_bytes()).interval == interval
    )


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing", "torn", "flipped"])
def test_rounded_run_redoes_the_first_interval_whose_log_is_not_whole(
    tmp_path: Path, damage: str
) -> None:
    """A log its line commits but the disk lost (or holds cut short) ends the committed prefix
    there: that interval is trained again, and the bundle is an uninterrupted run's. A stray
    log of a committed interval (nothing commits it) is not taken for the committed one."""
    from dk.pol.backends.ext import log_ext
    from dk.pol.backends.log import RoundingLog, decode_log

    def hurt(run: Path) -> None:
        path, log = _log_of(run, 1), decode_log(_log_of(run, 0).read_bytes())
        if damage == "missing":
            path.unlink()
        elif damage == "torn":
            path.write_bytes(path.read_bytes()[:-3])
        else:  # same size, other bytes: only the digest tells
            data = bytearray(path.read_bytes())
            data[-1] ^= 1
            path.write_bytes(bytes(data))
        stray = RoundingLog(log.job_id, 0, log.tau_log2, sites=log.sites + 1).encode()
        (run / log_ext(stray)["blob"]).write_bytes(stray)

    job = tiny_job(steps=16, interval=4, pol={"backend": "rounded"})
    assert _check_resume(job, tmp_path, kill_at=14, damage=hurt) == 4  # checkpoint 1


@pytest.mark.slow
def test_rounded_run_of_another_torch_release_is_not_resumed(tmp_path: Path) -> None:
    """Checkpoint 0's line commits the run's torch release; another one refuses the resume
    (its intervals would mix two releases' sites, SPEC VI §4)."""
    from dk.errors import JobMismatch

    job = tiny_job(steps=16, interval=4, pol={"backend": "rounded"})
    run = _killed_run(job, tmp_path, kill_at=14)
    log = run / "run.log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert '"ext": {"rounding": {"torch": "' in lines[0]
    lines[0] = re.sub(r'"torch": "[^"]*"', '"torch": "2.0.1"', lines[0])
    log.write_text("".join(lines))
    before = _files(run)
    with pytest.raises(JobMismatch, match=r"recorded under torch 2\.0\.1 and this is torch"):
        train_job(job, run, resume=True)
    assert _files(run) == before  # refused before anything was rewritten


def _files(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_rounded_run_of_an_earlier_dk_is_refused_untouched(tmp_path: Path) -> None:
    """Commit lines without the logs' names (dk before they held them): refused with one line,
    the run's files as they were (the prefix cut must not rewrite the log and the pack first)."""
    import json

    from dk.errors import JobMismatch

    job = tiny_job(steps=16, interval=4, pol={"backend": "rounded"})
    run = _killed_run(job, tmp_path, kill_at=14)
    log = run / "run.log.jsonl"
    old = []
    for line in log.read_text().splitlines():
        d = json.loads(line)
        d.pop("job_id", None)
        d.pop("ext", None)
        if "interval" in d:
            d["interval"]["ext"].pop("rounding_log")
        old.append(json.dumps(d) + "\n")
    log.write_text("".join(old))
    before = _files(run)
    with pytest.raises(JobMismatch, match="recorded by an earlier dk"):
        train_job(job, run, resume=True)
    assert _files(run) == before


def test_partial_run_of_another_job_is_refused(tmp_path: Path) -> None:
    run = _killed_run(tiny_job(steps=20, interval=5), tmp_path, kill_at=12)
    with pytest.raises(FormatError, match="another job"):
        train_job(tiny_job(steps=20, interval=5, seed=1), run, resume=True)


def test_partial_run_of_a_job_with_the_same_checkpoint_0_is_refused(tmp_path: Path) -> None:
    """Another backend, the same initial weights: checkpoint 0 alone cannot tell the jobs
    apart; the job_id of checkpoint 0's line does (a resume would mix two backends' steps)."""
    from dk.pol.checkpoint import checkpoint_root, initial_checkpoint

    job = tiny_job(steps=20, interval=5)
    other = tiny_job(steps=20, interval=5, pol={"backend": "torch"})
    spe = 1797 // 16  # steps per epoch of the digits set at batch 16
    assert other.job_id != job.job_id
    assert checkpoint_root(initial_checkpoint(other, spe)) == checkpoint_root(
        initial_checkpoint(job, spe)
    )
    run = _killed_run(job, tmp_path, kill_at=12)
    with pytest.raises(FormatError, match="another job"):
        train_job(other, run, resume=True)


def test_cli_resumes_automatically(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dk.cli.app import cli

    job = tiny_job(steps=20, interval=5)
    run = _killed_run(job, tmp_path, kill_at=12)
    r = CliRunner().invoke(cli, ["train", str(tmp_path / "job.toml"), "--out", str(run)])
    assert r.exit_code == 0, r.output
    assert "resuming the interrupted run" in r.stderr
    assert (run / "run.json").exists()
