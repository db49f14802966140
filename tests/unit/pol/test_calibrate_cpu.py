"""``dk calibrate`` measures what a worker on another CPU computes (SPEC §12.3, CPU variants).

torch's generic kernels (``ATEN_CPU_CAPABILITY=default``) stand for another CPU's: on the tiny
LM (bf16) they land ~1e5 times farther from the reference than another thread count does, so a
tolerance calibrated on thread counts alone would reject an honest worker on another CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from tests.helpers import tiny_job

from dk.cli.app import cli
from dk.pol.calibrate import DEFAULT_INTERVALS, UnsafeTolerance, calibrate
from dk.pol.calibrate_cpu import CpuVariantFailed, local_capability, replay_variant, variants

needs_a_variant = pytest.mark.skipif(
    local_capability() == "default", reason="this CPU runs torch's generic kernels already"
)


def dk(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)


def test_the_capabilities_below_this_cpus_are_replayed() -> None:
    assert variants("avx2") == (["default"], ["avx512"])
    assert variants("avx512") == (["default", "avx2"], [])
    assert variants("default") == ([], ["avx2", "avx512"])
    assert variants("sve256") == (["default"], [])
    assert local_capability() in ("default", "avx2", "avx512", "zvector", "vsx", "sve256")


def _reference(job: Any, intervals: int) -> tuple[list[Any], list[int]]:
    """The worker's chain of checkpoints, trained here on one thread (as calibrate does)."""
    from dk.pol.checkpoint import initial_checkpoint
    from dk.pol.data import load_dataset
    from dk.pol.replay import Replayer

    honest = job.with_updates(pol={"tolerance": 1.0})
    rep = Replayer(honest, load_dataset(honest), threads=1)
    steps = honest.checkpoint_steps()[: intervals + 1]
    cks = [initial_checkpoint(honest, rep.sampler.steps_per_epoch)]
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        cks.append(rep.run(cks[-1], a, b))
    return cks, steps


@pytest.mark.slow
@needs_a_variant
def test_generic_kernels_are_measured_and_the_unseparable_tiny_lm_is_refused(
    tmp_path: Path,
) -> None:
    """On the tiny LM at 2 steps per interval the generic kernels reach l2 ~ 0.04, where the
    thread counts reach ~1e-7: the recommendation must cover it, and then half the steps at
    double the learning rate lands inside: calibration (and so ``dk job init``) refuses."""
    from tests.examples.loader import load_example

    from dk.pol.replay import distances

    ex = load_example("tiny_lm")
    job = ex.consumer(tmp_path, text_bytes=4_000, steps=4, interval=2, seq_len=16, tolerance=0.5)
    cks, steps = _reference(job, DEFAULT_INTERVALS)
    ends = replay_variant(job, "default", cks, steps)
    generic = max(distances(cks[i], cks[i + 1], e)["l2"] for i, e in enumerate(ends))
    threads_only = calibrate(job, cpu_variants=False, cheats=False)
    assert generic > 1e-3 and generic > 1e3 * threads_only.max_l2  # the kernels really differ
    assert threads_only.recommended_tolerance < generic  # the hole: an honest worker rejected
    with pytest.raises(
        UnsafeTolerance, match=r"would accept (half_batch, )?half_steps_double_lr"
    ) as e:
        calibrate(job)  # the default for a tolerant job: the CPU variants run
    cal = e.value.calibration
    assert cal.cpu_variants and {r["cpu"] for r in cal.rows} >= {"default"}
    assert cal.max_l2 >= generic and cal.recommended_tolerance >= generic
    assert min(cal.cheats.values()) <= cal.recommended_tolerance and not cal.safe


def test_a_tolerant_job_calibrates_with_cpu_rows_and_can_skip_them(tmp_path: Path) -> None:
    job = tiny_job(mode="tolerant", tolerance=1e-3, steps=4, interval=2)
    (tmp_path / "job.toml").write_text(job.to_toml())
    r = dk("calibrate", tmp_path / "job.toml", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    here = d["cpu_capability"]
    assert d["cpu_variants"] == variants(here)[0] and d["cpu_not_measured"] == variants(here)[1]
    assert {row["cpu"] for row in d["rows"]} == {here, *d["cpu_variants"]}
    assert d["recommended_tolerance"] >= 10 * max(row["l2"] for row in d["rows"])
    r = dk("calibrate", tmp_path / "job.toml", "--no-cpu-variants", "--json")
    assert r.exit_code == 0, r.output
    assert {row["cpu"] for row in json.loads(r.output)["rows"]} == {here}
    r = dk("calibrate", tmp_path / "job.toml", "--threads", "1")
    assert r.exit_code == 0, r.output
    assert "cpu" in r.output.splitlines()[0] and "recommended tolerance" in r.output


@needs_a_variant
def test_a_variant_that_cannot_run_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dk.cli.app import main

    job = tiny_job(mode="tolerant", tolerance=1e-3, steps=4, interval=2)
    (tmp_path / "job.toml").write_text(job.to_toml())
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(tmp_path / "job.toml"), "--threads", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 4, err
    assert err.count("\n") == 1 and err.startswith("dk: error: CPU variant ATEN_CPU_CAPABILITY=")
    assert "cannot start" in err and "Traceback" not in err
    assert dk("calibrate", tmp_path / "job.toml", "--no-cpu-variants").exit_code == 0


@needs_a_variant
def test_a_variant_is_bounded_in_time() -> None:
    job = tiny_job(mode="tolerant", tolerance=1e-3, steps=4, interval=2)
    cks, steps = _reference(job, 1)
    with pytest.raises(
        CpuVariantFailed, match=r"no result within 0 s; `dk calibrate --no-cpu-variants` skips them"
    ):
        replay_variant(job, "default", cks, steps, timeout=0.2)


@needs_a_variant
def test_the_child_replays_what_the_parent_does_on_the_same_kernels() -> None:
    """The subprocess path itself adds nothing: under this CPU's own capability its replay is
    the reference, bit for bit (so a variant's distance is the kernels' alone)."""
    from dk.pol.replay import distances

    job = tiny_job(mode="tolerant", tolerance=1e-3, steps=4, interval=2)
    cks, steps = _reference(job, 2)
    ends = replay_variant(job, local_capability(), cks, steps)
    assert [distances(cks[i], cks[i + 1], e)["l2"] for i, e in enumerate(ends)] == [0.0, 0.0]
    with pytest.raises(CpuVariantFailed, match=r"torch ran '.*' kernels instead"):
        replay_variant(job, "nonsense", cks, steps)  # torch ignores a name it does not know
    if local_capability() == "avx2":  # a capability above this CPU's: its kernels do not run
        with pytest.raises(CpuVariantFailed, match=r"avx512 failed after \d+ s: killed by SIGILL"):
            replay_variant(job, "avx512", cks, steps)
