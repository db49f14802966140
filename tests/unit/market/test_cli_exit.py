"""``dk market`` exit codes: refusal 1, a party's --now on a production ledger 2, inconclusive 5."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from dk.cli.app import App
from dk.cli.market import _common
from dk.market import MarketRefused


def _command(result: Any) -> click.Command:
    @click.command()
    @_common
    def cmd(db: str, now: int | None) -> Any:
        if isinstance(result, Exception):
            raise result
        return result

    return cmd


@pytest.mark.parametrize(
    ("result", "code"),
    [
        ({"verdict": "accept", "ok": True}, 0),
        ({"verdict": "reject", "outcome": "rejected"}, 0),
        ({"verdict": "inconclusive", "reasons": ["DATA_UNAVAILABLE"]}, 5),
        (MarketRefused("REPORT_INCONCLUSIVE", "could not decide"), 5),
        (MarketRefused("NOT_DRAWN", "not drawn"), 1),
        (MarketRefused("CLOCK_LOCKED", "this ledger keeps its own time"), 2),
    ],
)
def test_exit_codes(result: Any, code: int) -> None:
    res = CliRunner().invoke(_command(result), ["--json"], obj=App())
    assert res.exit_code == code, res.output
    if isinstance(result, Exception):
        assert len([x for x in res.output.splitlines() if x.strip()]) == 1
