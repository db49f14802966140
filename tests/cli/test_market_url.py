"""`dk market … --url`: every party command against a real `dk market serve` subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from dk.crypto.keys import SigningKey

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def dk(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "dk.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=180,
    )
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("served")
    db = tmp / "market.db"
    dk("market", "init", "--db", db)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dk.cli", "market", "serve", "--db", str(db), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert m, line
    try:
        yield f"http://127.0.0.1:{m.group(1)}", tmp
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def keyfile(tmp: Path, name: str, n: int) -> Path:
    p = tmp / f"{name}.key"
    if not p.exists():
        SigningKey(bytes([n]) * 32).save(p)
    return p


def test_party_commands_over_http(server: tuple[str, Path]) -> None:
    url, tmp = server
    consumer = keyfile(tmp, "consumer", 1)
    dk("market", "deposit", "--url", url, "--key", consumer, "500")
    out = json.loads(dk("market", "balance", "--url", url, "--key", consumer, "--json").stdout)
    assert out["balance"] == 500
    dk("job", "init", "--out", tmp / "job.toml")
    placed = dk(
        "market",
        "order",
        "--url",
        url,
        "--key",
        consumer,
        "--job",
        tmp / "job.toml",
        "--max-price",
        "100",
        "--deadline",
        "600",
        "--json",
    )
    oid = json.loads(placed.stdout)["order_id"]
    balance = json.loads(dk("market", "balance", "--url", url, "--key", consumer, "--json").stdout)
    assert balance["balance"] == 400  # the escrow is locked on the server's ledger
    shown = json.loads(dk("market", "show", "--url", url, oid, "--json").stdout)
    assert shown["state"] == "open" and shown["escrow"] == 100
    dk("market", "cancel", "--url", url, "--key", consumer, oid)
    balance = json.loads(dk("market", "balance", "--url", url, "--key", consumer, "--json").stdout)
    assert balance["balance"] == 500
    dk("market", "withdraw", "--url", url, "--key", consumer, "200")
    audit = json.loads(dk("market", "audit", "--url", url, "--no-bls", "--json").stdout)
    assert audit["ok"] is True


def test_a_party_cannot_set_the_servers_clock(server: tuple[str, Path]) -> None:
    url, tmp = server
    r = dk(
        "market",
        "deposit",
        "--url",
        url,
        "--now",
        "999999999",
        "--key",
        keyfile(tmp, "x", 9),
        "5",
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "own time" in r.stderr


def test_refusals_keep_their_codes_over_http(server: tuple[str, Path]) -> None:
    url, tmp = server
    r = dk("market", "cancel", "--url", url, "--key", keyfile(tmp, "y", 10), "o1", check=False)
    assert (r.returncode == 1 and "UNKNOWN_ORDER" in r.stderr) or "NOT_OWNER" in r.stderr
    r = dk("market", "show", "--url", "http://127.0.0.1:9", "o1", check=False)
    assert r.returncode == 69 and "unreachable" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["notaurl", "127.0.0.1:8765", "ftp://127.0.0.1:21", "http://"])
def test_a_url_that_names_no_server_is_a_usage_error(bad: str) -> None:
    """Not a server that failed to answer (69): a command line to fix (2), one line."""
    r = dk("market", "show", "--url", bad, "o1", check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "is not a market server's URL" in r.stderr


def test_serve_on_a_busy_port_is_one_line(server: tuple[str, Path], tmp_path: Path) -> None:
    """The running server's port: refused before the ledger is touched, exit 2, no traceback."""
    url, _ = server
    port = url.rsplit(":", 1)[1]
    db = tmp_path / "other.db"
    r = dk("market", "serve", "--db", db, "--port", port, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "choose another --port" in r.stderr
    assert not db.exists() and not (tmp_path / "other.db.d").exists()


@pytest.mark.parametrize("bad", ["http://:8765", "http://user@:1", "http://[::1", "http://h:abc"])
def test_a_url_without_a_host_or_port_number_is_a_usage_error(bad: str) -> None:
    r = dk("market", "show", "--url", bad, "o1", check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "is not a market server's URL" in r.stderr


def test_listen_binds_every_address_of_the_host_or_none() -> None:
    """``localhost`` binds each address it resolves to (as asyncio's create_server), all on one
    port here; a port busy on one of them leaves nothing bound."""
    import socket

    from dk.errors import UsageError
    from dk.market.server import _listen

    want = {i[4][0] for i in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    socks = _listen("127.0.0.1", 0)
    try:
        assert [s.getsockname()[0] for s in socks] == ["127.0.0.1"]
        port = socks[0].getsockname()[1]
        with pytest.raises(UsageError, match="choose another --port"):
            _listen("localhost", port)  # 127.0.0.1 is taken (and ::1, if any, is released)
        if "::1" in want:
            probe = _listen("::1", port)  # nothing of the failed call holds ::1's port
            probe[0].close()
    finally:
        for s in socks:
            s.close()
    both = _listen("localhost", 0)
    try:
        assert {s.getsockname()[0] for s in both} == want
    finally:
        for s in both:
            s.close()
