"""Real training (issue 12): model files, buffers, schedules, augmentation, accumulation,
clipping, precision, the Recorder's checks on a user's loop, and calibration's cheats."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dk.errors import BackendUnavailable, FormatError, JobMismatch
from dk.pol import Recorder, build_model, load_job, train_job
from dk.pol.augment import augment_batch, step_seed
from dk.pol.checkpoint import checkpoint_root, initial_checkpoint
from dk.pol.jobinit import default_job
from dk.pol.pack import read_run_checkpoint
from dk.pol.recorder import TrainingDiverged
from dk.pol.replay import Replayer
from dk.pol.run import read_run
from dk.pol.schedule import lr_at, make_scheduler
from dk.pol.torch_adapter import make_loss, make_optimizer

torch.set_num_threads(1)

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn
    from dk.pol.augment import Dropout


    class Net(nn.Module):
        def __init__(self, width, classes, p):
            super().__init__()
            self.conv = nn.Conv2d(1, width, 3, padding=1)
            self.bn = nn.BatchNorm2d(width)
            self.drop = Dropout(p)
            self.fc = nn.Linear(width * 16, classes)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = nn.functional.max_pool2d(x, 2)
            return self.fc(self.drop(x.flatten(1)))


    def build(width=4, classes=10, p=0.0):
        return Net(width, classes, p)
    """
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    d = tmp_path_factory.mktemp("rt")
    dig = load_digits()
    X = (dig.data[:256] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    np.savez(d / "digits.npz", X=X, y=dig.target[:256].astype(np.int64))
    (d / "model.py").write_text(MODEL_PY)
    return d


def _job(folder: Path, mode: str = "exact", **train: Any) -> Any:
    t = {
        "optimizer": "sgd",
        "nesterov": True,
        "schedule": "step",
        "step_size": 4,
        "gamma": 0.5,
        "augment": ["crop:1", "flip"],
        "clip_norm": 0.5,
        "accumulation": 2,
        "label_smoothing": 0.1,
    }
    t.update(train)
    job = default_job(
        mode=mode,
        dataset="npz",
        data_path="digits.npz",
        base_dir=folder,
        steps=8,
        interval=4,
        batch_size=16,
        tolerance=0.01 if mode == "tolerant" else None,
        model={"source": "model.py", "kwargs": {"width": 4, "p": 0.25}},
        train=t,
    )
    (folder / "job.toml").write_text(job.to_toml())
    return load_job(folder / "job.toml")


def _user_loop(
    job: Any,
    run: Path,
    *,
    scheduler: bool = True,
    ascent: bool = False,
    clip: bool = False,
    scale: float = 1.0,
) -> Any:
    """An ordinary loop with the Recorder's three lines (``clip``: it clips too; ``scale``
    multiplies its loss)."""
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    sched = make_scheduler(job, opt) if scheduler else None
    rec = Recorder(job, run)
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=sched)
    acc = job.train["accumulation"]
    for i, (x, y) in enumerate(loader):
        with rec.autocast():
            out = model(x)
        loss = F.cross_entropy(out, y, label_smoothing=job.train["label_smoothing"]) * scale / acc
        (-loss if ascent else loss).backward()
        if i % acc == acc - 1:
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.train["clip_norm"])
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
    return rec.finish()


def test_model_file_job_pins_the_file(folder: Path) -> None:
    job = _job(folder)
    m = job.model
    assert m["arch"] == "custom" and m["factory"] == "build" and len(m["source_sha256"]) == 64
    assert job.pol["backend"] == "torch"  # the kernels do not compute model files
    assert job.init["method"] == "seeded" and job.pol["init_root"]
    (folder / "other").mkdir(exist_ok=True)
    (folder / "other" / "model.py").write_text(MODEL_PY + "\n# changed\n")
    (folder / "other" / "job.toml").write_text(job.to_toml())
    other = load_job(folder / "other" / "job.toml")
    with pytest.raises(FormatError, match="not the job's") as ei:
        build_model(other)
    assert ei.value.reason == "JOB_MISMATCH"


def test_checkpoints_commit_buffers_and_the_user_loop_replays_bit_for_bit(
    folder: Path, tmp_path: Path
) -> None:
    job = _job(folder)
    info = _user_loop(job, tmp_path / "run")
    ck = read_run_checkpoint(tmp_path / "run", info.checkpoints[1].root)
    assert ck["model/bn.num_batches_tracked"].dtype == np.int64
    assert int(ck["model/bn.num_batches_tracked"]) == 4 * job.train["accumulation"]
    assert "model/bn.running_mean" in ck and "optim/conv.weight/momentum_buffer" in ck
    # dk's own loop is the same computation: same roots
    assert [c.root for c in train_job(job, tmp_path / "dk").checkpoints] == [
        c.root for c in info.checkpoints
    ]
    # the verifier's replay (same machine, torch on one thread) reproduces the committed roots
    rep = Replayer(job, __import__("dk.pol.data", fromlist=["x"]).load_dataset(job))
    start = initial_checkpoint(job, rep.sampler.steps_per_epoch)
    for i, c in enumerate(info.checkpoints[1:]):
        end = rep.run(start, i * 4, (i + 1) * 4)
        assert checkpoint_root(end).hex() == c.root
        start = end


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(("clip", "scale"), [(0.05, 1.0), (1e-4, 1e-3)])
def test_a_loop_that_clips_too_is_warned_once(
    folder: Path, tmp_path: Path, clip: float, scale: float
) -> None:
    """dk clips in the recorded ``opt.step()``; a loop that clips as well scales its gradients
    twice (the replay clips once): one warning naming the cause, also where the norm before
    clipping is small (1e-3: ``clip_grad_norm_``'s ``1e-6`` is then a large part of it). The
    loop that leaves the job's clipping to dk (which replays bit for bit) gets none."""
    job = _job(folder, clip_norm=clip)  # below the gradients' norm: every step clips
    _user_loop(job, tmp_path / "once", scale=scale)
    with pytest.warns(UserWarning, match="clip_grad_norm_") as caught:
        _user_loop(job, tmp_path / "twice", clip=True, scale=scale)
    assert len(caught) == 1 and "step 0" in str(caught[0].message)


def test_a_scheduler_that_is_not_the_jobs_is_refused(folder: Path, tmp_path: Path) -> None:
    job = _job(folder)
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    with pytest.raises(JobMismatch, match="step schedule"):
        Recorder(job, tmp_path / "a").attach(model=model, optimizer=opt)
    wrong = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with pytest.raises(JobMismatch, match=r"lr 0.025 at step 2"):
        Recorder(job, tmp_path / "b").attach(model=model, optimizer=opt, scheduler=wrong)
    assert opt.param_groups[0]["lr"] == job.train["lr"]  # the dry run rewinds


def test_torch_schedulers_work_on_the_recorded_optimizer(folder: Path, tmp_path: Path) -> None:
    job = _job(folder)
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    rec = Recorder(job, tmp_path / "run")
    _, ropt, _ = rec.attach(model=model, optimizer=opt, scheduler=sched)
    assert isinstance(ropt, torch.optim.Optimizer)
    later = torch.optim.lr_scheduler.LambdaLR(ropt, lambda e: 1.0)  # no TypeError
    assert later.get_last_lr() == [job.train["lr"]]


def test_lr_schedules() -> None:
    from dk.pol.job import JobSpec, normalize

    def j(**t: Any) -> Any:
        return JobSpec(normalize({"model": {"input_dim": 4, "output_dim": 2}, "train": t}))

    assert [lr_at(j(lr=1.0), t) for t in (0, 99)] == [1.0, 1.0]
    s = j(lr=1.0, schedule="step", step_size=10, gamma=0.1)
    assert [lr_at(s, t) for t in (0, 9, 10, 25)] == [1.0, 1.0, 0.1, 0.1 * 0.1]
    c = j(lr=1.0, schedule="cosine", warmup_steps=10, steps=110, min_lr=0.1)
    assert lr_at(c, 0) == 0.1 and lr_at(c, 9) == 1.0 and lr_at(c, 10) == 1.0
    assert lr_at(c, 60) == pytest.approx(0.55) and lr_at(c, 110) == pytest.approx(0.1)


def test_augmentation_is_specified_and_per_step(folder: Path) -> None:
    job = _job(folder)
    x = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    a, b = augment_batch(job, 5, x), augment_batch(job, 5, x)
    assert np.array_equal(a, b) and a.shape == x.shape
    assert any(not np.array_equal(augment_batch(job, t, x), a) for t in range(6, 12))
    # by hand from the stream (SPEC §8.3): crop:1 draws dy, dx in [0, 2]; flip draws f
    from dk.crypto.hashing import u64
    from dk.crypto.stream import WordReader, stream_key

    r = WordReader(stream_key("augment", job.seed, u64(5)))
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for i in range(2):
        dy, dx, f = r.uniform_int(3), r.uniform_int(3), r.uniform_int(2)
        win = pad[i, :, dy : dy + 3, dx : dx + 3]
        assert np.array_equal(a[i], win[:, :, ::-1] if f else win)
    assert step_seed(0, 1, 0) != step_seed(0, 1, 1) != step_seed(0, 2, 1)


def test_gradient_ascent_in_exact_mode_on_kernels_is_refused(tmp_path: Path) -> None:
    job = default_job(steps=4, interval=2, hidden=[8])
    assert job.pol["backend"] == "dk"
    model = build_model(job)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    rec = Recorder(job, tmp_path / "run")
    model, opt, loader = rec.attach(model=model, optimizer=opt)
    with pytest.raises(JobMismatch, match="gradients differ"):
        for x, y in loader:
            opt.zero_grad()
            (-F.cross_entropy(model(x), y)).backward()
            opt.step()


def test_the_honest_loop_on_kernels_is_accepted(tmp_path: Path) -> None:
    job = default_job(steps=4, interval=2, hidden=[8])
    model = build_model(job)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    rec = Recorder(job, tmp_path / "run")
    model, opt, loader = rec.attach(model=model, optimizer=opt)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert rec.finish().complete


def test_divergence_stops_at_the_first_non_finite_update(folder: Path, tmp_path: Path) -> None:
    job = _job(folder, clip_norm=0.0)
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    rec = Recorder(job, tmp_path / "run")
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=make_scheduler(job, opt))
    with pytest.raises(TrainingDiverged, match="step 1: the update made"):
        for i, (x, _y) in enumerate(loader):
            out = model(x)
            loss = out.sum() * (float("nan") if i >= 2 else 1.0)
            loss.backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
    assert not (tmp_path / "run" / "run.json").exists()


def test_micro_batches_and_precision_are_checked(folder: Path, tmp_path: Path) -> None:
    job = _job(folder)
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    rec = Recorder(job, tmp_path / "a")
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=make_scheduler(job, opt))
    x, y = next(iter(loader))
    assert x.shape[0] == 8  # 16 per step in 2 micro-batches
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(JobMismatch, match="ran 1 training forward pass"):
        opt.step()
    bf = _job(folder, precision="bf16")
    model = build_model(bf)
    opt = make_optimizer(bf, model.parameters())
    rec = Recorder(bf, tmp_path / "b")
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=make_scheduler(bf, opt))
    with pytest.raises(JobMismatch, match=r"inside `with rec.autocast"):
        model(next(iter(loader))[0])
    with rec.autocast():
        assert model(next(iter(loader))[0]).dtype == torch.float32  # cast back for the loss


def test_bf16_run_records_and_replays(folder: Path, tmp_path: Path) -> None:
    job = _job(folder, precision="bf16")
    info = _user_loop(job, tmp_path / "run")
    assert info.complete and read_run(tmp_path / "run") == info
    assert [c.root for c in train_job(job, tmp_path / "dk").checkpoints] == [
        c.root for c in info.checkpoints
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_job_without_cuda_says_so(folder: Path, tmp_path: Path) -> None:
    job = _job(folder, device="cuda")
    with pytest.raises(BackendUnavailable, match="no CUDA"):
        train_job(job, tmp_path / "run")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_run_verifies_on_cpu_within_tolerance(folder: Path, tmp_path: Path) -> None:
    from dk.pol.data import load_dataset
    from dk.pol.replay import distances

    job = _job(folder, mode="tolerant", device="cuda", precision="bf16")
    info = train_job(job, tmp_path / "run")
    cks = [read_run_checkpoint(tmp_path / "run", c.root) for c in info.checkpoints]
    rep = Replayer(job, load_dataset(job), threads=None, device="cpu")
    d = distances(cks[0], cks[1], rep.run(cks[0], 0, 4))
    assert d["l2"] < 0.05, d


def test_calibration_prints_the_cheats_and_refuses_a_tolerance_they_fit(
    folder: Path,
) -> None:
    from dk.pol.calibrate import UnsafeTolerance, calibrate

    job = _job(folder, mode="tolerant")
    cal = calibrate(job, intervals=1, replay_threads=(1,))
    assert set(cal.cheats) == {"half_steps_double_lr", "lower_precision", "half_batch"}
    assert all(d > cal.recommended_tolerance for d in cal.cheats.values()) and cal.safe
    with pytest.raises(UnsafeTolerance, match="would accept"):
        calibrate(job, intervals=1, replay_threads=(1,), floor=1e3)
    forced = calibrate(job, intervals=1, replay_threads=(1,), floor=1e3, force=True)
    assert not forced.safe and forced.forced


def test_job_init_writes_what_calibrate_recommends(folder: Path) -> None:
    from dk.pol.calibrate import calibrate

    job = default_job(mode="tolerant", steps=20, interval=10, hidden=[8])
    assert job.pol["tolerance"] == calibrate(job, intervals=2, cheats=False).recommended_tolerance


def test_bad_model_files_are_one_line_errors(folder: Path) -> None:
    for i, (src, match) in enumerate(
        [
            ("import nonexistent_pkg_xyz\n", "failed to import: ModuleNotFoundError"),
            ("def build():\n    return 3\n", "returned int, not a torch.nn.Module"),
            ("def build():\n    raise RuntimeError('boom')\n", "factory failed: RuntimeError"),
            (
                "import torch\ndef build():\n    return torch.nn.Linear(2, 2).double()\n",
                "float64",
            ),
        ]
    ):
        d = folder / f"bad{i}"
        d.mkdir(exist_ok=True)
        (d / "model.py").write_text(src)
        (d / "job.toml").write_text("[model]\nsource = 'model.py'\n")
        with pytest.raises(FormatError, match=match) as ei:
            build_model(load_job(d / "job.toml"))
        assert "\n" not in str(ei.value)


def test_entry_point_is_pinned_by_version_and_digest(tmp_path: Path, monkeypatch: Any) -> None:
    import sys

    from dk.pol.job import JobSpec, normalize
    from dk.pol.modelsrc import entry_digest, load_factory

    (tmp_path / "dkmodelpkg").mkdir()
    (tmp_path / "dkmodelpkg" / "__init__.py").write_text("")
    (tmp_path / "dkmodelpkg" / "nets.py").write_text(
        "import torch\ndef build(n=2):\n    return torch.nn.Linear(n, n)\n"
    )
    dist = tmp_path / "dkmodelpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dkmodelpkg\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    digest = entry_digest("dkmodelpkg.nets:build")

    def job(**m: Any) -> Any:
        base = {
            "entry": "dkmodelpkg.nets:build",
            "distribution": "dkmodelpkg",
            "dist_version": "1.0",
            "module_sha256": digest,
        }
        return JobSpec(normalize({"model": {**base, **m}}))

    assert load_factory(job())(n=3).weight.shape == (3, 3)
    with pytest.raises(FormatError, match=r"version 1.0, the job pins 2.0"):
        load_factory(job(dist_version="2.0"))
    with pytest.raises(FormatError, match=r"differs from the job's model.module_sha256"):
        load_factory(job(module_sha256="00" * 32))
    sys.modules.pop("dkmodelpkg.nets", None)
    sys.modules.pop("dkmodelpkg", None)


def test_fine_tuning_from_init_safetensors(folder: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    d = tmp_path / "ft"
    d.mkdir()
    for f in ("model.py", "digits.npz"):
        (d / f).write_bytes((folder / f).read_bytes())
    pre = _job(folder)
    state = {
        k: (v * np.float32(0.5) if v.dtype == np.float32 else v)
        for k, v in initial_checkpoint(pre, 1).items()
        if k.startswith("model/")
    }
    save_file(
        {k[6:]: np.ascontiguousarray(v).reshape(v.shape) for k, v in state.items()},
        str(d / "init.safetensors"),
    )
    job = default_job(
        dataset="npz",
        data_path="digits.npz",
        base_dir=d,
        steps=4,
        interval=2,
        batch_size=16,
        model={"source": "model.py", "kwargs": {"width": 4}},
        init={"method": "file"},
    )
    assert job.init["root"] and "path" not in job.hashed_form()["init"]
    model = build_model(job)
    assert torch.equal(model.conv.weight, torch.from_numpy(state["model/conv.weight"]))
    assert train_job(job, tmp_path / "run").complete
    (d / "init.safetensors").write_bytes(b"garbage")
    with pytest.raises(FormatError, match="init"):
        build_model(job)


def test_loss_variants() -> None:
    from dk.pol.job import JobSpec, normalize

    j = JobSpec(
        normalize(
            {
                "model": {"input_dim": 4, "output_dim": 5},
                "train": {"loss": "next_token_cross_entropy", "label_smoothing": 0.1},
                "pol": {"backend": "torch"},
            }
        )
    )
    out = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([[0, 1, 2], [3, 4, 0]])
    want = F.cross_entropy(out.reshape(6, 5), y.reshape(6), label_smoothing=0.1)
    assert torch.equal(make_loss(j)(out, y), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_loss(j)(out.bfloat16(), y).dtype == torch.float32


def test_dk_job_init_from_a_draft_and_dk_train(folder: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dk.cli.app import cli

    d = tmp_path / "job"
    d.mkdir()
    for f in ("model.py", "digits.npz"):
        (d / f).write_bytes((folder / f).read_bytes())
    (d / "draft.toml").write_text(
        "[model]\nsource = 'model.py'\n[data]\nkind = 'npz'\npath = 'digits.npz'\n"
        "[train]\nsteps = 4\nbatch_size = 16\nschedule = 'cosine'\nwarmup_steps = 2\n"
        "[pol]\ninterval = 2\nmode = 'tolerant'\n"
    )
    r = CliRunner().invoke(
        cli, ["job", "init", "--from", str(d / "draft.toml"), "--out", str(d / "job.toml")]
    )
    assert r.exit_code == 0, r.output
    job = load_job(d / "job.toml")
    assert job.pol["init_root"] and job.data["root"] and job.model["source_sha256"]
    assert job.pol["tolerance"] > 0
    r = CliRunner().invoke(cli, ["train", str(d / "job.toml"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert read_run(tmp_path / "run").complete
    cuda = d / "cuda.toml"
    cuda.write_text((d / "job.toml").read_text().replace('device = "cpu"', 'device = "cuda"'))
    if not torch.cuda.is_available():
        from dk.cli.app import main

        with pytest.raises(SystemExit) as ei:
            main(["train", str(cuda), "--out", str(tmp_path / "run2")])
        assert ei.value.code == 4


def test_dk_export_writes_the_final_weights(folder: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from safetensors.numpy import load_file

    from dk.cli.app import cli
    from dk.crypto.keys import SigningKey
    from dk.pol.export import export_weights
    from dk.prover import prove_run

    job = _job(folder)
    info = train_job(job, tmp_path / "run")
    last = read_run_checkpoint(tmp_path / "run", info.checkpoints[-1].root)
    prove_run(tmp_path / "run", job, SigningKey(bytes(32)), tmp_path / "bundle")
    for src in ("run", "bundle"):
        r = CliRunner().invoke(
            cli, ["export", str(tmp_path / src), "--out", str(tmp_path / f"{src}.st"), "--json"]
        )
        assert r.exit_code == 0, r.output
        got = load_file(str(tmp_path / f"{src}.st"))
        assert set(got) == {k[6:] for k in last if k.startswith("model/")}
        assert all((got[k] == last[f"model/{k}"]).all() for k in got)
    model = build_model(job)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in got.items()})
    blob = tmp_path / "bundle" / "blobs" / f"{info.checkpoints[-1].root}.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="does not hash"):
        export_weights(tmp_path / "bundle", tmp_path / "x.st")


def test_the_report_says_exact_on_torch_is_same_machine_only(folder: Path, tmp_path: Path) -> None:
    from dk.crypto.keys import SigningKey
    from dk.prover import prove_run
    from dk.verifier import verify_bundle

    job = _job(folder)
    assert job.mode == "exact" and job.pol["backend"] == "torch"
    train_job(job, tmp_path / "run")
    prove_run(tmp_path / "run", job, SigningKey(bytes(32)), tmp_path / "bundle")
    report = verify_bundle(tmp_path / "bundle", job, beacon=bytes(32), samples=1)
    assert report.ok and report.flags == ["same-machine-only"]


def test_dk_export_onnx_runs_the_final_model(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dk export --onnx` writes the final model (eval mode, batch dynamic) from the consumer's
    job: onnxruntime on it gives the torch model's outputs on a batch size it was not traced
    with. Without the job or with one path for both: usage, exit 2; another job, or no such
    directory: exit 3; each one line, and nothing written."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from click.testing import CliRunner

    from dk.cli.app import cli

    job = _job(folder)
    train_job(job, tmp_path / "run")
    onnx_path, st = tmp_path / "m.onnx", tmp_path / "m.st"
    args = ["export", str(tmp_path / "run"), "--out", str(st), "--onnx", str(onnx_path)]
    r = CliRunner().invoke(cli, [*args, "--job", str(folder / "job.toml"), "--json"])
    assert r.exit_code == 0, r.output
    assert '"dynamic_batch": true' in r.output
    from safetensors.torch import load_file

    model = build_model(job)
    model.load_state_dict(load_file(str(st)))
    model.eval()
    x = np.random.default_rng(7).random((5, 1, 8, 8), dtype=np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, build_model(job).eval()(torch.from_numpy(x)).detach().numpy())

    from dk.cli.app import main

    other = folder / "other_seed"
    other.mkdir(exist_ok=True)
    for f in ("model.py", "digits.npz"):
        (other / f).write_bytes((folder / f).read_bytes())
    (other / "job.toml").write_text(job.to_toml().replace(f"seed = {job.seed}", "seed = 99"))
    assert load_job(other / "job.toml").job_id != job.job_id
    bad = ["export", str(tmp_path / "run"), "--out", str(tmp_path / "x.st")]
    for extra, msg, code in (
        (["--onnx", str(tmp_path / "x.onnx")], "needs the consumer's job", 2),
        (["--onnx", str(tmp_path / "x.st"), "--job", str(folder / "job.toml")], "same file", 2),
        (["--onnx", str(tmp_path / "x.onnx"), "--job", str(other / "job.toml")], "made for", 3),
        (["--onnx", str(tmp_path / "no" / "x.onnx"), "--job", str(folder / "job.toml")], "no d", 3),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as ei:
            main([*bad, *extra])
        err = capsys.readouterr().err
        assert ei.value.code == code and msg in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "x.st").exists() and not (tmp_path / "x.onnx").exists()


def test_a_step_without_backward_is_refused(folder: Path, tmp_path: Path) -> None:
    """A loop that never calls backward() would step on nothing while the replay steps on the
    job's loss: the Recorder refuses at the first step, naming it."""
    job = _job(folder, mode="tolerant", augment=[], clip_norm=0.0, accumulation=1)
    model = build_model(job)
    opt = make_optimizer(job, model.parameters())
    rec = Recorder(job, tmp_path / "run")
    model, opt, loader = rec.attach(model=model, optimizer=opt, scheduler=make_scheduler(job, opt))
    x, _ = next(iter(loader))
    model(x)
    with pytest.raises(JobMismatch, match=r"step 0: optimizer.step\(\) with no gradients"):
        opt.step()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_a_cuda_job_without_cuda_is_exit_4_at_attach(folder: Path, tmp_path: Path) -> None:
    """Not "move the model to cuda" (which cannot be done here): the backend is missing."""
    job = _job(folder, mode="tolerant", device="cuda")
    rec = Recorder(job, tmp_path / "run")
    with pytest.raises(BackendUnavailable, match="no CUDA device") as ei:
        rec.attach(
            model=build_model(job), optimizer=make_optimizer(job, build_model(job).parameters())
        )
    assert ei.value.exit_code == 4
    with pytest.raises(BackendUnavailable):
        _ = rec.device


def test_export_onnx_without_the_exporter_is_exit_4_before_writing(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from dk.pol.export import export_weights

    job = _job(folder)
    train_job(job, tmp_path / "run")
    export_weights(tmp_path / "run", tmp_path / "ok.st")  # the weights alone need no exporter
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import fails as if not installed
    with pytest.raises(BackendUnavailable, match=r"dk-pol\[onnx\]") as ei:
        export_weights(tmp_path / "run", tmp_path / "w.st", onnx=tmp_path / "m.onnx", job=job)
    assert ei.value.exit_code == 4 and not (tmp_path / "w.st").exists()
