"""``dk train`` of a data-parallel job: without a launcher it is a usage error in one line."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from tests.unit.dist.conftest import dp_job

from dk.cli.app import cli


def test_train_a_dp_job_needs_ray_and_keys(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(dp_job().to_toml())
    r = CliRunner().invoke(
        cli, ["train", str(tmp_path / "job.toml"), "--out", str(tmp_path / "run")]
    )
    assert r.exit_code == 2
    assert "train.world_size = 2" in r.output and "torchrun" in r.output
    assert not (tmp_path / "run").exists()


def test_ray_needs_the_jobs_world_size(tmp_path: Path) -> None:
    """--world-size must equal the job's (checked before Ray starts: no cluster needed)."""
    import pytest

    from dk.dist.ray_launch import train_on_ray
    from dk.errors import DkError

    with pytest.raises(DkError, match="world_size is 2"):
        train_on_ray(dp_job(), tmp_path / "run", key_dir=tmp_path, world_size=3)
