"""The run plot: loss and update norm per interval, challenged intervals marked, offline."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.helpers import WORKER, make_bundle, tiny_job
from vectors.gen.forge import Forgery

from dk.cli.app import cli
from dk.verifier import verify_bundle
from dk.verifier.plot import write_plot

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return make_bundle(tmp_path_factory.mktemp("plot"), tiny_job(steps=40, interval=5))


def _marks(svg: str, cls: str, series: str) -> set[int]:
    root = ET.fromstring(svg)
    panel = next(g for g in root.iter(f"{SVG}g") if g.get("data-series") == series)
    return {int(e.get("data-interval", "-1")) for e in panel.iter() if e.get("class") == cls}


def _svg_of(page: str) -> str:
    m = re.search(r"<svg .*?</svg>", page, flags=re.S)
    assert m is not None
    return m.group(0)


def test_html_marks_the_challenged_intervals(honest: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = honest
    rep = verify_bundle(bundle, job, beacon=b"\x02" * 32, samples=3, topq=1)
    assert rep.ok and 3 <= len(rep.challenged) < 8
    page = write_plot(bundle, tmp_path / "p.html", report=rep.to_dict()).read_text()
    svg = _svg_of(page)
    for series in ("loss", "norm"):
        assert _marks(svg, "challenged", series) == set(rep.challenged)
        assert _marks(svg, "challenged-band", series) == set(rep.challenged)
        assert _marks(svg, "failed", series) == set()
    root = ET.fromstring(svg)
    lines = [p for p in root.iter(f"{SVG}polyline")]
    assert len(lines) == 2 and all(len(p.get("points", "").split()) == 8 for p in lines)
    # self-contained: no script, no fetched resource
    assert "<script" not in page and not re.search(r"(src|href)\s*=", page)
    assert page.count("<tr>") == 1 + len(rep.challenged)


def test_findings_are_crossed_and_svg_output(honest: tuple[Any, Path], tmp_path: Path) -> None:
    job, bundle = honest
    f = Forgery(bundle, tmp_path / "forged")
    f.m["intervals"][4]["ext"]["loss"] *= 0.5
    forged = f.commit(WORKER)
    rep = verify_bundle(forged, job, beacon=b"\x02" * 32, samples=8)
    assert rep.codes == ["LOSS_MISMATCH"]
    svg = write_plot(forged, tmp_path / "p.svg", report=rep.to_dict()).read_text()
    assert svg.startswith("<svg ")
    assert _marks(svg, "failed", "loss") == {4}
    assert _marks(svg, "challenged", "loss") == set(range(8))


def test_cli_verify_plot_and_dk_plot(
    honest: tuple[Any, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dk.cli.app import main

    job, bundle = honest
    (tmp_path / "job.toml").write_text(job.to_toml())
    runner = CliRunner()
    args = ["verify", str(bundle), "--job", str(tmp_path / "job.toml"), "--beacon", "02" * 32]
    r = runner.invoke(cli, [*args, "--json", "--plot", str(tmp_path / "v.html")])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    (tmp_path / "report.json").write_text(r.stdout)
    svg = _svg_of((tmp_path / "v.html").read_text())
    assert _marks(svg, "challenged", "loss") == set(report["challenged"])
    out = tmp_path / "again.svg"
    rr = ["plot", str(bundle), "-o", str(out), "--report", str(tmp_path / "report.json")]
    r = runner.invoke(cli, rr)
    assert r.exit_code == 0, r.output
    assert _marks(out.read_text(), "challenged", "norm") == set(report["challenged"])
    (tmp_path / "bad.json").write_text("{not json")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*rr[:-1], str(tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert e.value.code == 3 and "not JSON" in err and len(err.strip().splitlines()) == 1


def test_plot_of_a_malformed_manifest_is_one_line(tmp_path: Path) -> None:
    from dk.cli.app import main

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["plot", str(tmp_path / "b"), "-o", str(tmp_path / "x.html")])
    assert e.value.code == 3
    assert not (tmp_path / "x.html").exists()
