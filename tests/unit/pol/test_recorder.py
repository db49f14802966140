"""Recording a user's own loop (Recorder), its checks, and exact replay of the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.helpers import WORKER, tiny_job

from dk.errors import FormatError
from dk.pol import Recorder, build_model, train_job
from dk.pol.checkpoint import checkpoint_root
from dk.pol.data import Dataset, check_dims, load_dataset
from dk.pol.models import build_torch_model
from dk.pol.pack import read_run_checkpoint
from dk.pol.recorder import JobMismatch
from dk.pol.replay import replay_interval
from dk.pol.run import RunInfo, read_run
from dk.prover import prove_run

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def job() -> Any:
    return tiny_job()


@pytest.fixture(scope="module")
def reference(job: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunInfo]:
    run = tmp_path_factory.mktemp("ref") / "run"
    return run, train_job(job, run)


def _sgd(job: Any, model: torch.nn.Module, **over: Any) -> torch.optim.SGD:
    t = job.train
    kw = dict(lr=t["lr"], momentum=t["momentum"], weight_decay=t["weight_decay"])
    kw.update(over)
    return torch.optim.SGD(model.parameters(), **kw)


def test_train_job_run_directory(job: Any, reference: tuple[Path, RunInfo]) -> None:
    run, info = reference
    assert info.complete and info.job_id == job.job_id.hex()
    assert [c.step for c in info.checkpoints] == job.checkpoint_steps()
    assert [(i.start_step, i.end_step) for i in info.intervals] == list(
        zip(job.checkpoint_steps()[:-1], job.checkpoint_steps()[1:], strict=True)
    )
    assert all(i.update_norm > 0 for i in info.intervals)
    assert read_run(run) == info
    lines = [json.loads(x) for x in (run / "run.log.jsonl").read_text().splitlines()]
    assert [x["checkpoint"]["root"] for x in lines] == [c.root for c in info.checkpoints]
    assert (
        checkpoint_root(read_run_checkpoint(run, info.checkpoints[0].root)).hex()
        == (job.pol["init_root"])
    )


@pytest.fixture(scope="module", params=["dk", "torch"])
def backend_run(
    request: pytest.FixtureRequest,
    job: Any,
    reference: tuple[Path, RunInfo],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Any, Path, RunInfo]:
    """The tiny job on each exact-mode backend (dk kernels, torch on one thread), trained once."""
    if request.param == job.pol["backend"]:
        return (job, *reference)
    other = tiny_job(pol={"backend": request.param})
    run = tmp_path_factory.mktemp(request.param) / "run"
    return other, run, train_job(other, run)


def test_backends_are_distinct_jobs(backend_run: tuple[Any, Path, RunInfo], job: Any) -> None:
    bjob, _, info = backend_run
    assert bjob.mode == "exact" and info.job_id == bjob.job_id.hex()
    assert (bjob.job_id == job.job_id) == (bjob.pol["backend"] == job.pol["backend"])


def test_user_loop_matches_train_job(
    backend_run: tuple[Any, Path, RunInfo], tmp_path: Path
) -> None:
    job, _, ref = backend_run
    with Recorder(job, tmp_path / "user") as rec:
        model = build_model(job)
        model, opt, loader = rec.attach(model=model, optimizer=_sgd(job, model))
        assert len(loader) == job.steps
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    info = read_run(tmp_path / "user")
    assert [c.root for c in info.checkpoints] == [c.root for c in ref.checkpoints]
    assert [i.batch_commitment for i in info.intervals] == [
        i.batch_commitment for i in ref.intervals
    ]


def test_replay_reproduces_every_committed_root(backend_run: tuple[Any, Path, RunInfo]) -> None:
    job, run, info = backend_run
    ds = load_dataset(job)
    for iv in info.intervals:
        start = read_run_checkpoint(run, info.checkpoints[iv.index].root)
        end = replay_interval(job, ds, start, iv.start_step, iv.end_step)
        assert checkpoint_root(end).hex() == info.checkpoints[iv.index + 1].root


def _attach(
    job: Any, tmp: Path, *, model: Any = None, optimizer: Any = None, loader: Any = None
) -> None:
    rec = Recorder(job, tmp / "run")
    model = model if model is not None else build_model(job)
    optimizer = optimizer if optimizer is not None else _sgd(job, model)
    rec.attach(model=model, optimizer=optimizer, loader=loader)
    rec.finish()


@pytest.mark.parametrize(
    "case, match",
    [
        ("torch-init", "initial weight"),
        ("other-shape", "parameters"),
        ("adam", "torch.optim.SGD"),
        ("lr", "lr="),
        ("momentum", "momentum="),
        ("weight-decay", "weight_decay="),
        ("nesterov", "nesterov="),
        ("maximize", "maximize="),
        ("foreach", "foreach=False"),
        ("two-groups", "one parameter group"),
        ("param-order", "model order"),
        ("stateful", "already has state"),
        ("loader-batch", "batch_size 8"),
        ("loader-dataset", "100 samples"),
    ],
)
def test_attach_rejects_what_is_not_the_job(
    case: str, match: str, job: Any, tmp_path: Path
) -> None:
    model = build_model(job)
    kw: dict[str, Any] = {}
    if case == "torch-init":
        kw["model"] = build_torch_model(job.model)
    elif case == "other-shape":
        kw["model"] = build_torch_model({**job.model, "hidden": [9]})
    elif case == "adam":
        kw["optimizer"] = torch.optim.Adam(model.parameters(), lr=job.train["lr"])
    elif case == "lr":
        kw["optimizer"] = _sgd(job, model, lr=0.01)
    elif case == "momentum":
        kw["optimizer"] = _sgd(job, model, momentum=0.5)
    elif case == "weight-decay":
        kw["optimizer"] = _sgd(job, model, weight_decay=1e-4)
    elif case == "nesterov":
        kw["optimizer"] = _sgd(job, model, nesterov=True)
    elif case == "maximize":
        kw["optimizer"] = _sgd(job, model, maximize=True)
    elif case == "foreach":
        kw["optimizer"] = _sgd(job, model, foreach=True)
    elif case == "two-groups":
        ps = list(model.parameters())
        kw["optimizer"] = torch.optim.SGD(
            [{"params": ps[:2]}, {"params": ps[2:]}],
            lr=job.train["lr"],
            momentum=job.train["momentum"],
        )
    elif case == "param-order":
        kw["optimizer"] = torch.optim.SGD(
            list(model.parameters())[::-1], lr=job.train["lr"], momentum=job.train["momentum"]
        )
    elif case == "stateful":
        opt = _sgd(job, model)
        model(torch.zeros(2, 64)).sum().backward()
        opt.step()
        with torch.no_grad():  # put the initial weights back: only the optimizer state differs
            for name, p in build_model(job).named_parameters():
                model.get_parameter(name).copy_(p)
        kw["optimizer"] = opt
    elif case == "loader-batch":
        ds = load_dataset(job)
        kw["loader"] = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.from_numpy(ds.X), torch.from_numpy(ds.y)),
            batch_size=8,
        )
    elif case == "loader-dataset":
        kw["loader"] = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.zeros(100, 64)), batch_size=job.train["batch_size"]
        )
    kw.setdefault("model", model)
    with pytest.raises(JobMismatch, match=match):
        _attach(job, tmp_path, **kw)
    assert not (tmp_path / "run" / "run.json").exists()


def test_adam_decoupled_weight_decay_is_refused(tmp_path: Path) -> None:
    job = tiny_job(optimizer="adam", train={"weight_decay": 0.01})
    model = build_model(job)
    t = job.train
    ok = dict(lr=t["lr"], betas=tuple(t["betas"]), eps=t["eps"], weight_decay=t["weight_decay"])
    with pytest.raises(JobMismatch, match="decoupled_weight_decay"):
        _attach(
            job,
            tmp_path,
            model=model,
            optimizer=torch.optim.Adam(model.parameters(), **ok, decoupled_weight_decay=True),
        )
    with pytest.raises(JobMismatch, match="amsgrad"):
        _attach(
            job,
            tmp_path,
            model=model,
            optimizer=torch.optim.Adam(model.parameters(), **ok, amsgrad=True),
        )


def _loop(
    job: Any,
    run: Path,
    extra_steps: int = 0,
    stop_after: int | None = None,
    double_step_at: int | None = None,
) -> None:
    with Recorder(job, run) as rec:
        model = build_model(job)
        model, opt, loader = rec.attach(model=model, optimizer=_sgd(job, model))
        for t, (x, y) in enumerate(loader):
            if stop_after is not None and t == stop_after:
                break
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if t == double_step_at:
                opt.step()
        for _ in range(extra_steps):
            opt.step()


def test_two_steps_per_batch_are_refused(job: Any, tmp_path: Path) -> None:
    with pytest.raises(JobMismatch, match="exactly once per batch"):
        _loop(job, tmp_path / "run", double_step_at=3)
    assert not (tmp_path / "run" / "run.json").exists()


def test_extra_and_missing_steps_are_refused(job: Any, tmp_path: Path) -> None:
    with pytest.raises(JobMismatch, match="more optimizer steps"):
        _loop(job, tmp_path / "a", extra_steps=1)
    with pytest.raises(JobMismatch, match="stopped at step 7"):
        _loop(job, tmp_path / "b", stop_after=7)
    with pytest.raises(FormatError, match="incomplete"):
        read_run(tmp_path / "b")
    with pytest.raises(FormatError, match="not a run directory"):
        read_run(tmp_path / "nothing")


def test_data_that_is_not_the_jobs_is_refused(job: Any, tmp_path: Path) -> None:
    ds = load_dataset(job)
    other = Dataset(ds.X.copy(), ds.y.copy())
    other.X[0, 0] += 1.0
    with pytest.raises(FormatError, match=r"data\.root") as ei:
        Recorder(job, tmp_path / "run", dataset=other)
    assert ei.value.reason == "DATA_MISMATCH"


def test_prove_run_checks_the_job_and_refuses_overwrite(
    job: Any, reference: tuple[Path, RunInfo], tmp_path: Path
) -> None:
    run, _ = reference
    with pytest.raises(FormatError, match="different job"):
        prove_run(run, tiny_job(seed=5), WORKER, tmp_path / "b1")
    bundle = prove_run(run, job, WORKER, tmp_path / "b2")
    assert (bundle / "manifest.json").is_file() and (bundle / "signature.hex").is_file()
    assert len(list((bundle / "blobs").iterdir())) == len(job.checkpoint_steps())
    with pytest.raises(FileExistsError):
        prove_run(run, job, WORKER, tmp_path / "b2")
    assert len(json.loads((bundle / "manifest.json").read_text())["checkpoints"]) == 5


@pytest.mark.parametrize(
    "model, match",
    [({"input_dim": 32}, "32 inputs"), ({"output_dim": 5}, "5 outputs, the data has 10 classes")],
)
def test_a_model_that_does_not_fit_the_data_is_refused(
    job: Any, model: dict, match: str, tmp_path: Path
) -> None:
    bad = job.with_updates(model=model)
    with pytest.raises(FormatError, match=match) as ei:
        Recorder(bad, tmp_path / "run")
    assert ei.value.reason == "JOB_MALFORMED"
    assert not (tmp_path / "run").exists()
    wider = job.with_updates(model={"output_dim": 12})  # spare logits are fine for cross-entropy
    check_dims(wider, load_dataset(wider))
    with pytest.raises(FormatError, match="mse targets need 10"):
        check_dims(wider.with_updates(train={"loss": "mse"}), load_dataset(wider))


_NO_TORCH = """
import sys
from pathlib import Path
from tests.helpers import tiny_job
from dk.pol import train_job
from dk.pol.data import load_dataset
from dk.pol.replay import Replayer, replay_matches
from dk.pol.pack import read_run_checkpoint
from dk.pol.run import read_run
job = tiny_job()
info = train_job(job, Path(sys.argv[1]) / "run")
assert "torch" not in sys.modules, "dk train on dk kernels imported torch"
blob = lambda i: read_run_checkpoint(Path(sys.argv[1]) / "run", info.checkpoints[i].root)
ok, _ = replay_matches(Replayer(job, load_dataset(job)), blob(0), blob(1),
                       bytes.fromhex(info.checkpoints[1].root), 0, job.interval)
assert ok
assert "torch" not in sys.modules, "an exact replay on dk kernels imported torch"
print("no torch")
"""


def test_engine_runs_and_exact_replays_never_import_torch(tmp_path: Path) -> None:
    """Fixed cost (issue 11): torch is not loaded by recording or replaying on dk's kernels."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    r = subprocess.run([sys.executable, "-c", _NO_TORCH, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no torch"


def test_progress_is_throttled_but_sees_the_last_step(
    job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dk.pol.recorder as recorder

    monkeypatch.setattr(recorder, "PROGRESS_PERIOD_S", 1e9)
    seen: list[int] = []
    train_job(job, tmp_path / "run", progress=seen.append)
    assert seen == [1, job.steps]  # first step, then nothing until the last


def test_run_is_made_durable_once_before_run_json(
    job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sync of every blob and the log when the run completes, before run.json exists."""
    import dk.pol.recorder as recorder

    calls: list[tuple[list[Path], bool]] = []
    run = tmp_path / "run"
    monkeypatch.setattr(
        recorder,
        "sync_files",
        lambda paths: calls.append((list(paths), (run / "run.json").exists())),
    )
    train_job(job, run)
    assert len(calls) == 1
    paths, run_json_existed = calls[0]
    assert not run_json_existed
    assert {p.name for p in paths} == {"blobs.pack", "run.log.jsonl"}  # small blobs: packed


def _hidden(model: torch.nn.Module, change: str) -> torch.nn.Module:
    """The job's model with state outside its ``state_dict`` that each forward may change."""
    model.calls, model.scale = 0, 1.0  # type: ignore[assignment]  # public plain scalars
    model.register_buffer("ema", torch.zeros(10), persistent=False)
    model.register_buffer("mask", torch.ones(10), persistent=False)  # constant: fine

    def hook(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        if change == "attribute":
            mod.calls += 1
        elif change == "buffer":
            with torch.no_grad():
                mod.ema.mul_(0.5).add_(out.detach().mean(0))
        return out * mod.mask - mod.ema

    model.register_forward_hook(hook)
    return model


@pytest.mark.parametrize("backend", ["torch", "rounded"])
@pytest.mark.parametrize(
    ("change", "named"), [("none", None), ("attribute", "`calls`"), ("buffer", "`ema`")]
)
def test_state_outside_the_checkpoint_is_refused_when_it_changes(
    tmp_path: Path, backend: str, change: str, named: str | None
) -> None:
    """SPEC §10.1: a replay starts from a checkpoint and a fresh model, so a model that changes
    a non-persistent buffer or a public scalar attribute while it trains is refused at the first
    checkpoint after the change, naming it; constant ones are fine. (On dk's kernels the user's
    model only mirrors the engine's arrays: its own state plays no part.)"""
    job = tiny_job(steps=10, pol={"backend": backend})
    rec = Recorder(job, tmp_path / "run")
    model = _hidden(build_model(job), change)
    model, opt, loader = rec.attach(model=model, optimizer=_sgd(job, model))

    def run() -> None:
        with rec:
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()

    if named is None:
        run()
        assert len(read_run(tmp_path / "run").checkpoints) == job.steps // job.interval + 1
        return
    with pytest.raises(JobMismatch, match=f"by step {job.interval}: {named}.*persistent"):
        run()


def test_a_replay_starts_from_a_fresh_models_hidden_state(tmp_path: Path) -> None:
    """The verifier's Replayer puts non-persistent buffers and scalar attributes back to a
    fresh model's before each interval, so an interval replays the same whether or not the
    same Replayer replayed others first (the verdict does not depend on the challenge)."""
    from dk.pol.replay import Replayer
    from dk.pol.torch_adapter import hidden_state

    job = tiny_job(steps=10, pol={"backend": "torch"})
    info = train_job(job, tmp_path / "run")
    ck = [read_run_checkpoint(tmp_path / "run", c.root) for c in info.checkpoints]
    ds = load_dataset(job)

    def replayer() -> Replayer:
        rep = Replayer(job, ds)
        _hidden(rep.model, "attribute")  # its output grows with a counter of forwards
        _hidden(rep.model, "buffer")
        rep._hidden = hidden_state(rep.model)  # as built
        return rep

    alone = replayer().run(ck[1], 5, 10)
    both = replayer()
    both.run(ck[0], 0, 5)
    after = both.run(ck[1], 5, 10)
    assert checkpoint_root(after) == checkpoint_root(alone)


def test_a_forward_inside_rec_paused_is_not_the_steps(tmp_path: Path) -> None:
    """``rec.paused()``: no gradients, no loss, no step seed, no forward count; a run with a
    metric forward in every step is dk train's (roots and committed losses)."""
    job = tiny_job(steps=10, pol={"backend": "torch"})
    want = train_job(job, tmp_path / "want")
    rec = Recorder(job, tmp_path / "run")
    model = build_model(job)
    model, opt, loader = rec.attach(model=model, optimizer=_sgd(job, model))
    grads = []
    with rec:
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            with rec.paused():
                grads.append(torch.is_grad_enabled())
                model(x).argmax(1)
            opt.step()
    got = read_run(tmp_path / "run")
    assert grads == [False] * job.steps
    assert [c.root for c in got.checkpoints] == [c.root for c in want.checkpoints]
    assert [i.ext for i in got.intervals] == [i.ext for i in want.intervals]


def test_hidden_state_holding_nan_is_unchanged() -> None:
    from dk.pol.torch_adapter import check_hidden_state, hidden_state

    m = torch.nn.Linear(2, 2)
    m.limit = float("nan")  # type: ignore[assignment]
    m.register_buffer("cache", torch.full((2,), float("nan")), persistent=False)
    before = hidden_state(m)
    check_hidden_state(m, before, 1)
    m.cache[0] = 1.0
    with pytest.raises(JobMismatch, match="`cache`"):
        check_hidden_state(m, before, 2)
    m.cache[0] = float("nan")
    m.limit = 1.0  # type: ignore[assignment]
    with pytest.raises(JobMismatch, match=r"`limit`, an attribute \(nan -> 1.0\)"):
        check_hidden_state(m, before, 3)
