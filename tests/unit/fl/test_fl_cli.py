"""``dk fl run`` (SPEC §VII.1): Flower rounds with PoL-gated aggregation, end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dk.cli.app import cli

pytest.importorskip("flwr")


@pytest.fixture
def job_file(template, tmp_path):
    p = tmp_path / "job.toml"
    p.write_text(template.to_toml())
    return p


def test_usage_errors(job_file, tmp_path):
    r = CliRunner().invoke(cli, ["fl", "run", str(job_file), "--clients", "2", "--lazy", "3"])
    assert r.exit_code == 2 and "more than --clients" in r.output
    r = CliRunner().invoke(cli, ["fl", "run", str(job_file), "--clients", "1"])
    assert r.exit_code == 2


def test_a_data_parallel_job_is_refused_before_any_round(template, tmp_path):
    """A ``train.world_size = 2`` job: one line, exit 2, before the data is split (it failed
    late, inside the clients' first round)."""
    job = tmp_path / "dp.toml"
    job.write_text(template.with_updates(train={"world_size": 2}).to_toml())
    work = tmp_path / "work"
    r = subprocess.run(
        [sys.executable, "-m", "dk.cli", "fl", "run", str(job), "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "train.world_size = 2" in r.stderr and r.stderr.count("\n") == 1
    assert not work.exists()


@pytest.mark.slow
def test_server_and_two_client_processes(job_file, tmp_path):
    """Coordinator and 2 clients as separate processes talking gRPC on 127.0.0.1."""
    args = ["fl", "run", str(job_file), "--clients", "2", "--rounds", "2", "--lazy", "1"]
    args += ["--engine", "grpc", "--samples", "2", "--workdir", str(tmp_path / "w"), "--json"]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    r1, r2 = doc["reports"]
    assert r1["accepted"] == ["client0", "client1"] and r1["rejected"] == []
    assert r2["accepted"] == ["client1"]
    assert [(x["client"], x["codes"]) for x in r2["rejected"]] == [("client0", ["JOB_MISMATCH"])]
    assert 0.0 < doc["accuracy"] <= 1.0


@pytest.mark.slow
def test_ray_simulation(job_file, tmp_path):
    args = ["fl", "run", str(job_file), "--clients", "2", "--rounds", "1", "--samples", "1"]
    args += ["--aggregator", "median", "--workdir", str(tmp_path / "w"), "--json"]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (rep,) = json.loads(r.stdout)["reports"]
    assert rep["accepted"] == ["client0", "client1"] and rep["aggregator"] == "median"


@pytest.mark.slow
def test_secure_aggregation_with_server_and_client_processes(job_file, tmp_path):
    """SecAgg (SPEC §VII.2) across a coordinator and 3 client processes on 127.0.0.1."""
    args = ["fl", "run", str(job_file), "--clients", "3", "--rounds", "2", "--lazy", "1"]
    args += ["--engine", "grpc", "--samples", "2", "--secagg", "secagg", "--threshold", "2"]
    args += ["--workdir", str(tmp_path / "w"), "--json"]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r1, r2 = json.loads(r.stdout)["reports"]
    assert r1["aggregator"] == "secagg" and r1["secagg"] == {"n": 3, "t": 2, "degree": 2}
    assert r1["accepted"] == ["client0", "client1", "client2"] and r1["rejected"] == []
    # The lazy client's old bundle answers round 1's job: it is never admitted to round 2.
    assert r2["accepted"] == ["client1", "client2"]
    assert [(x["client"], x["codes"]) for x in r2["rejected"]] == [("client0", ["JOB_MISMATCH"])]


@pytest.mark.slow
def test_secaggplus_in_the_ray_simulation(job_file, tmp_path):
    args = ["fl", "run", str(job_file), "--clients", "3", "--rounds", "1", "--samples", "1"]
    args += ["--secagg", "plus", "--workdir", str(tmp_path / "w"), "--json"]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (rep,) = json.loads(r.stdout)["reports"]
    assert rep["aggregator"] == "secagg+" and rep["accepted"] == ["client0", "client1", "client2"]


def test_secagg_usage_errors(job_file):
    base = ["fl", "run", str(job_file), "--clients", "3", "--secagg", "plus"]
    r = CliRunner().invoke(cli, [*base, "--aggregator", "median"])
    assert r.exit_code == 2 and "fedavg" in r.output
    r = CliRunner().invoke(cli, [*base, "--threshold", "5"])
    assert r.exit_code == 2 and "threshold" in r.output
