"""``pol.backend = "rounded"`` jobs end to end in one process: record, prove, verify, dispute,
and the record-time errors for loops and models a verifier could not follow (SPEC VI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from dk.crypto.keys import SigningKey
from dk.errors import FormatError, JobMismatch

KEY = SigningKey(bytes(range(32)))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _job(**kw: Any) -> Any:
    from dk.pol import default_job

    args: dict[str, Any] = dict(arch="cnn", optimizer="adam", steps=4, interval=2, batch_size=16)
    return default_job(**{**args, **kw}, pol={"backend": "rounded"})


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from dk.pol.train import train_job
    from dk.prover import prove_run

    torch.set_num_threads(1)
    job = _job()
    work = tmp_path_factory.mktemp("rounded")
    train_job(job, work / "run")
    return job, prove_run(work / "run", job, KEY, work / "bundle")


def test_dk_train_prove_verify_accepts(bundle: tuple[Any, Path]) -> None:
    from dk.pol.transcript import parse_manifest
    from dk.verifier import verify_bundle

    job, b = bundle
    man = parse_manifest((b / "manifest.json").read_bytes())
    assert man.ext == {"rounding": {"torch": torch.__version__.split("+")[0]}}
    for iv in man.interval_entries:
        ext = iv.ext["rounding_log"]  # type: ignore[index]
        assert ext["blob"] == f"logs/{ext['digest']}.dkrl"
        assert (b / ext["blob"]).stat().st_size == ext["nbytes"]
    rep = verify_bundle(b, job, beacon=bytes(32), samples=100)
    assert rep.ok, rep.to_dict()
    assert rep.checks["rounding_logs"] == "pass" and rep.figures["rounding_log_bytes_read"] > 0


def test_verify_replays_on_the_device_asked_for(bundle: tuple[Any, Path]) -> None:
    """``verify_bundle(device=...)`` / ``dk verify --device``: on the CPU it accepts; CUDA on a
    machine without it is the verifier's own trouble (inconclusive, exit 5), never a reject."""
    from click.testing import CliRunner

    from dk.cli.app import cli
    from dk.verifier import verify_bundle

    job, b = bundle
    assert verify_bundle(b, job, beacon=bytes(32), samples=100, device="cpu").ok
    if torch.cuda.is_available():  # a GPU machine: the CUDA replay of this CPU run accepts
        assert verify_bundle(b, job, beacon=bytes(32), samples=100, device="cuda").ok
        return
    rep = verify_bundle(b, job, beacon=bytes(32), samples=100, device="cuda")
    assert rep.verdict == "inconclusive" and rep.codes == ["BACKEND_UNAVAILABLE"]
    job_file = b.parent / "job.toml"
    job_file.write_text(job.to_toml())
    res = CliRunner().invoke(
        cli, ["verify", str(b), "--job", str(job_file), "--beacon", "00" * 32, "--device", "cuda"]
    )
    assert res.exit_code == 5 and "torch sees no CUDA device" in res.output


def test_dispute_primitive_follows_the_log(bundle: tuple[Any, Path], tmp_path: Path) -> None:
    from vectors.gen.forge import Forgery
    from vectors.gen.rounding_bundle import _other_interval

    from dk.verifier.replay import replay_interval

    job, b = bundle
    assert replay_interval(b, job, 1).ok
    forged = _other_interval(Forgery(b, tmp_path / "f"), KEY)
    res = replay_interval(forged, job, 1)
    assert (res.verdict, res.reason) == ("reject", "ROUNDING_LOG_MISMATCH")


def test_rounding_ext_outside_a_rounded_job_is_malformed(tmp_path: Path) -> None:
    from vectors.gen.forge import Forgery

    from dk.pol.backends.ext import log_ext
    from dk.pol.backends.log import RoundingLog
    from dk.verifier import verify_bundle

    honest = Path(__file__).resolve().parents[3] / "vectors" / "bundle"
    f = Forgery(honest / "honest", tmp_path / "f")
    iv = f.m["intervals"][0]
    iv["ext"] = {
        **iv.get("ext", {}),
        "rounding_log": log_ext(RoundingLog(bytes(32), 0, 12).encode()),
    }
    rep = verify_bundle(f.commit(KEY), honest / "job.toml", beacon=bytes(32), samples=1)
    assert rep.codes[0] == "TRANSCRIPT_MALFORMED", rep.codes


def _users_loop(job: Any, run: Path, extra: Any = None, paused: Any = None) -> None:
    from dk.pol import Recorder, build_model

    model = build_model(job)
    t = job.train
    opt = torch.optim.Adam(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                           eps=t["eps"], foreach=False)  # fmt: skip
    rec = Recorder(job, run)
    model, opt, loader = rec.attach(model=model, optimizer=opt)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out, y).backward()
        if extra is not None:
            extra(i, out)
        if paused is not None:
            with rec.paused():
                paused(i, model, x, y)
        opt.step()
    rec.finish()


def test_metrics_inside_rec_paused_are_outside_the_log(
    bundle: tuple[Any, Path], tmp_path: Path
) -> None:
    """``rec.paused()`` (the public form the refusal names): a metric computed there, every
    step or now and then, leaves the run dk train's, logs included."""
    from dk.pol.run import read_run

    accs: list[float] = []

    def accuracy(i: int, model: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        if i % 2 == 0:
            accs.append((model(x).argmax(1) == y).float().mean().item())

    job, b = bundle
    _users_loop(job, tmp_path / "run", paused=accuracy)
    assert len(accs) == (job.steps + 1) // 2
    want, got = read_run(b.parent / "run"), read_run(tmp_path / "run")
    assert [c.root for c in got.checkpoints] == [c.root for c in want.checkpoints]
    assert [i.ext for i in got.intervals] == [i.ext for i in want.intervals]


def test_users_loop_is_recorded_like_dk_train(bundle: tuple[Any, Path], tmp_path: Path) -> None:
    from dk.pol.run import read_run

    job, b = bundle
    _users_loop(job, tmp_path / "run")
    want = read_run(b.parent / "run")
    got = read_run(tmp_path / "run")
    assert [c.root for c in got.checkpoints] == [c.root for c in want.checkpoints]
    assert [i.ext for i in got.intervals] == [i.ext for i in want.intervals]


def test_a_metric_in_some_steps_is_refused_at_record_time(tmp_path: Path) -> None:
    def metric(i: int, out: torch.Tensor) -> None:
        if i == 1:  # a float metric every so often: sites the job's step does not have
            out.detach().softmax(-1).mean()

    with pytest.raises(JobMismatch, match=r"step 1 ran .* of shape .*rec\.paused\(\)"):
        _users_loop(_job(), tmp_path / "run", metric)


def test_a_model_whose_shapes_follow_the_data_is_refused_naming_the_shapes(
    tmp_path: Path,
) -> None:
    """The same operation on another shape from step to step (a boolean mask): refused at
    record time with both shapes, as not covered (SPEC VI §5)."""

    def masked(i: int, out: torch.Tensor) -> None:  # as h[h > 0].exp() would: rows vary
        out.detach()[: 2 + i % 2].exp()

    pattern = r"exp\.default of shape \(3, 10\) where the first step had exp\.default of shape"
    with pytest.raises(JobMismatch, match=pattern + r".*shapes depend on the data"):
        _users_loop(_job(), tmp_path / "run", masked)


def test_a_metric_in_every_step_is_refused_at_the_first_checkpoint(tmp_path: Path) -> None:
    def metric(i: int, out: torch.Tensor) -> None:
        out.detach().softmax(-1).mean()

    with pytest.raises(JobMismatch, match="interval 0"):
        _users_loop(_job(), tmp_path / "run", metric)


def test_an_uncovered_operation_is_named_at_record_time(tmp_path: Path) -> None:
    from dk.pol.backends.rounded import UnsupportedOp, clear_dead_modes

    def metric(i: int, out: torch.Tensor) -> None:
        F.softplus(out.detach())

    with pytest.raises(UnsupportedOp, match="softplus"):
        _users_loop(_job(), tmp_path / "run", metric)
    assert clear_dead_modes() == 1  # the loop never finished its Recorder: the mode is left


def test_rounded_jobs_are_fp32_or_bf16() -> None:
    assert _job(train={"precision": "bf16"}).train["precision"] == "bf16"
    with pytest.raises(FormatError, match="fp32 or under bf16 autocast"):
        _job(train={"precision": "fp16"})


def test_replay_failures_map_to_spec_vi_codes() -> None:
    from dk.pol.backends import rounding_reason
    from dk.pol.backends.rounded import RoundingLogError, UnsupportedOp

    assert rounding_reason(UnsupportedOp("x")) == "BACKEND_UNAVAILABLE"  # the verifier's side
    assert rounding_reason(RoundingLogError("x", reason="ROUNDING_LOG_INVALID")) == (
        "ROUNDING_LOG_INVALID"
    )
    assert rounding_reason(FormatError("x", reason="SHAPE_MISMATCH")) is None


def test_the_bundles_logs_are_copies_of_the_runs(bundle: tuple[Any, Path]) -> None:
    """``dk prove`` copies the logs: editing a bundle's file (a tamper test, a mistake) leaves
    the run, which can be proved again, as it was."""
    _, b = bundle
    logs = sorted((b / "logs").glob("*.dkrl"))
    assert logs
    for log in logs:
        run_log = b.parent / "run" / "logs" / log.name
        assert log.read_bytes() == run_log.read_bytes()
        assert not log.samefile(run_log)


def test_torchs_dropout_is_refused_pointing_to_dks(tmp_path: Path) -> None:
    from dk.pol.backends.rounded import UnsupportedOp, clear_dead_modes

    clear_dead_modes()

    def dropout(i: int, out: torch.Tensor) -> None:
        F.dropout(out.detach(), 0.5, training=True)

    with pytest.raises(UnsupportedOp, match=r"bernoulli.*dk\.pol\.augment\.Dropout"):
        _users_loop(_job(), tmp_path / "run", dropout)
    assert clear_dead_modes() == 1
