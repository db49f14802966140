"""``dk verify`` as a process ends without interpreter teardown once its report is out, with
the report complete and the documented exit code (dk.cli.app.console_main)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import make_bundle

ROOT = Path(__file__).resolve().parents[2]
# An atexit hook stands for the teardown: it prints only when the interpreter tears down.
RUN = (
    "import atexit, sys; atexit.register(lambda: print('TEARDOWN', file=sys.stderr)); "
    "sys.argv = ['dk'] + sys.argv[1:]; from dk.cli.app import console_main; console_main()"
)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("quick")
    job, bundle = make_bundle(tmp)
    (tmp / "job.toml").write_text(job.to_toml())
    return tmp / "job.toml", bundle


def _dk(*args: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", RUN, *map(str, args)], capture_output=True, text=True, env=env
    )


def test_verify_leaves_without_teardown(honest: tuple[Path, Path], tmp_path: Path) -> None:
    job, bundle = honest
    ok = _dk("verify", bundle, "--job", job, "--beacon", "00" * 32, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "accept"
    assert "TEARDOWN" not in ok.stderr
    gone = _dk("verify", tmp_path / "nowhere", "--job", job, "--json")
    assert gone.returncode == 5 and json.loads(gone.stdout)["verdict"] == "inconclusive"
    assert "TEARDOWN" not in gone.stderr


def test_usage_errors_keep_their_message_and_other_commands_tear_down(tmp_path: Path) -> None:
    bad = _dk("verify", "--no-such-option")
    assert bad.returncode == 2 and "No such option" in bad.stderr
    key = _dk("keygen", "--out", tmp_path / "k.key")
    assert key.returncode == 0 and "TEARDOWN" in key.stderr
