"""``dk compress check`` and ``dk compress bench`` through click."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dk.cli.app import cli


def test_check_json():
    res = CliRunner().invoke(
        cli, ["compress", "check", "--size", "2000", "--no-cuda", "--json"], catch_exceptions=False
    )
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["ok"] is True and {k["kernel"] for k in doc["kernels"]} >= {"topk_exact", "rng"}


def test_check_text():
    res = CliRunner().invoke(
        cli, ["compress", "check", "--size", "500", "--no-cuda"], catch_exceptions=False
    )
    assert res.exit_code == 0 and "ok   quantize_int8      numba  n=500" in res.output


def test_bench_json_small():
    res = CliRunner().invoke(
        cli,
        ["compress", "bench", "--size", "4096", "--repeats", "1", "--json"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0
    rows = json.loads(res.output)["rows"]
    assert rows[0]["kernel"] == "topk_exact" and all(r["numba"] > 0 for r in rows)


def test_bench_rejects_bad_size():
    res = CliRunner().invoke(cli, ["compress", "bench", "--size", "10"])
    assert res.exit_code == 2
