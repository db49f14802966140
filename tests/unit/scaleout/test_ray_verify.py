"""Verification on a real local Ray (ray.init(num_cpus=2)), never a mock (SPEC §12.5)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tests.helpers import WORKER, make_bundle  # noqa: E402
from vectors.gen.forge import FORGERIES, Forgery  # noqa: E402

from dk.verifier import verify_bundle  # noqa: E402
from dk.verifier.executors import RayExecutor  # noqa: E402
from dk.verifier.many import summary, verify_many  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
BEACON = bytes(32)


@pytest.fixture(scope="module")
def executor() -> Iterator[RayExecutor]:
    ex = RayExecutor("local", num_cpus=2)
    yield ex
    ray.shutdown()


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    return make_bundle(tmp_path_factory.mktemp("ray-honest"))


def test_ray_report_is_the_local_report(executor: RayExecutor, honest: tuple[object, Path]) -> None:
    job, bundle = honest
    local = verify_bundle(bundle, job, beacon=BEACON, samples=4, topq=0)
    remote = verify_bundle(bundle, job, beacon=BEACON, samples=4, topq=0, executor=executor)
    assert local.ok and remote.ok
    assert remote.figures["executor"] == "ray"
    assert remote.digest() == local.digest()
    assert remote.figures["replayed_intervals"] == 4


def test_a_forgery_is_rejected_on_ray_for_the_same_reason(
    executor: RayExecutor, honest: tuple[object, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    forge, _ = FORGERIES["skipped-interval"]
    forged = forge(Forgery(bundle, tmp_path / "skip"), WORKER)
    local = verify_bundle(forged, job, beacon=BEACON, samples=1000)
    remote = verify_bundle(forged, job, beacon=BEACON, samples=1000, executor=executor)
    assert local.verdict == remote.verdict == "reject"
    assert remote.codes == local.codes == ["REPLAY_MISMATCH", "REPLAY_MISMATCH"]
    assert remote.digest() == local.digest()


def test_a_worker_killed_mid_replay_is_retried(
    honest: tuple[object, Path], tmp_path: Path, executor: RayExecutor
) -> None:
    job, bundle = honest
    marker = tmp_path / "killed"
    retrying = RayExecutor("local", retries=2, kill_once=str(marker))
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4, topq=0, executor=retrying)
    assert marker.exists(), "no worker was killed: the test would prove nothing"
    assert rep.ok, rep.codes
    assert rep.digest() == verify_bundle(bundle, job, beacon=BEACON, samples=4, topq=0).digest()


def test_a_worker_killed_past_its_retries_is_inconclusive_never_accept(
    honest: tuple[object, Path], tmp_path: Path, executor: RayExecutor
) -> None:
    job, bundle = honest
    marker = tmp_path / "killed"
    brittle = RayExecutor("local", retries=0, kill_once=str(marker))
    rep = verify_bundle(bundle, job, beacon=BEACON, samples=4, topq=0, executor=brittle)
    assert marker.exists()
    assert rep.verdict == "inconclusive" and rep.codes == ["EXECUTOR_FAILED"]


def test_verify_many_on_ray_matches_one_by_one(
    executor: RayExecutor, honest: tuple[object, Path], tmp_path: Path
) -> None:
    job, bundle = honest
    root = tmp_path / "round"
    root.mkdir()
    shutil.copytree(bundle, root / "a-honest")
    forge, _ = FORGERIES["skipped-interval"]
    forge(Forgery(bundle, root / "b-skip"), WORKER)
    (root / "not-a-bundle").mkdir()
    local = verify_many(root, job, beacon=BEACON, samples=1000)
    remote = verify_many(root, job, executor=executor, beacon=BEACON, samples=1000)
    assert [n for n, _ in remote] == ["a-honest", "b-skip"]
    assert [r["digest"] for _, r in remote] == [r["digest"] for _, r in local]
    s = summary(remote)
    assert (s["accept"], s["reject"], s["inconclusive"]) == (1, 1, 0)


def test_cli_without_ray_says_so_in_one_line(honest: tuple[object, Path], tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    job, bundle = honest
    (tmp_path / "job.toml").write_text(job.to_toml())  # type: ignore[attr-defined]
    code = (
        "import sys; sys.modules['ray'] = None\n"  # Ray not installed
        "from dk.cli.app import main; main(sys.argv[1:])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "verify", str(bundle), "--job", str(tmp_path / "job.toml"),
         "--ray", "local"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert r.returncode == 4, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "dk-pol[ray]" in r.stderr


def test_cli_verify_on_local_ray(honest: tuple[object, Path], tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    job, bundle = honest
    (tmp_path / "job.toml").write_text(job.to_toml())  # type: ignore[attr-defined]
    r = subprocess.run(
        [sys.executable, "-m", "dk.cli", "verify", str(bundle), "--job",
         str(tmp_path / "job.toml"), "--ray", "local", "--beacon", "00" * 32, "--samples", "2",
         "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    local = verify_bundle(bundle, job, beacon=BEACON, samples=2)
    assert d["digest"] == local.digest().hex() and d["figures"]["executor"] == "ray"
