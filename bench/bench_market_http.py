"""`make bench` (market server): signed order/bid/match per second over HTTP vs in-process.

The same workload — per lane, a consumer's order, a worker's bid and the consumer's match,
each a signed request — goes once straight into :meth:`Market.execute` and once over HTTP to
``dk market serve`` on 127.0.0.1 (the server in its own process, as deployed; ``CLIENTS``
client processes, each with one keep-alive connection and one request in flight).

What a client does before the timed window, as a real one would: it signs its orders and
bids (and their deposits) ahead. A match names the order id the market assigned, so it is
signed inside the timed window, on both paths, right after the order's answer.

Three HTTP figures: the lean load generator (``http.client``, one reused connection per
process), the library's own client (:class:`RemoteMarket`, httpx), and the batch endpoint
(``POST /v1/requests/batch``, ``BATCH`` envelopes per POST, each with its own signature,
result and transaction). Target: >= 1,000 signed operations per second over HTTP, single
requests, on this machine. The server applies requests on one writer thread, so the
in-process rate (the ledger with the server's settings) is its ceiling. The server's and the
clients' CPU time per operation are printed too: on a shared machine they move less than the
rates do.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from dk.crypto.canonical_json import canonical_json
from dk.crypto.keys import SigningKey
from dk.market import Client, Market, MarketConfig

N_ORDERS = 500  # each is order + bid + match: 1,500 signed state changes per run
CLIENTS = 4
BATCH = 16
TARGET = 1000.0
MATCH = object()  # sentinel in a lane's list: sign a match of the order just placed (its id comes
# from the order's result, so this request cannot be signed ahead)


def _requests(
    market_id: bytes, deadline: int, lanes: range | list[int] = range(CLIENTS)
) -> list[tuple[Client, list[Any]]]:
    """Per lane: its consumer and its pre-signed requests (deposits, then order, bid, MATCH)."""
    out: list[tuple[Client, list[Any]]] = []
    for t in lanes:
        consumer = Client(SigningKey(bytes([10 + t]) * 32), market_id)
        worker = Client(SigningKey(bytes([50 + t]) * 32), market_id)
        batch: list[Any] = [
            consumer.request("deposit", amount=10**9),
            worker.request("deposit", amount=10**9),
        ]
        for i in range(N_ORDERS // CLIENTS):
            batch.append(
                consumer.request(
                    "order",
                    job_id=f"{t:02x}{i:062x}",
                    max_price=100,
                    min_stake=1,
                    deadline=deadline,
                    tags={"lane": f"t{t}"},
                )
            )
            batch.append(
                worker.request("bid", price=50, capacity=1, stake=1, tags={"lane": f"t{t}"})
            )
            batch.append(MATCH)
        out.append((consumer, batch))
    return out


def _drive(execute: Any, consumer: Client, batch: list[Any]) -> int:
    """Send one lane's requests in order; returns how many the market applied."""
    last_order = None
    for req in batch:
        if req is MATCH:
            req = canonical_json(consumer.request("match", order_id=last_order))
        out = execute(req)
        last_order = out.get("order_id", last_order)
    return len(batch)


def _drive_batched(post: Any, consumer: Client, batch: list[Any]) -> int:
    """The same lane through the batch endpoint: its pre-signed requests ``BATCH`` per POST,
    then the matches of the orders placed (signed in the window), ``BATCH`` per POST."""
    signed = [r for r in batch if r is not MATCH]
    orders: list[str] = []
    for i in range(0, len(signed), BATCH):
        orders += [res["order_id"] for res in post(signed[i : i + BATCH]) if "job_id" in res]
    for i in range(0, len(orders), BATCH):
        chunk = [
            canonical_json(consumer.request("match", order_id=o)) for o in orders[i : i + BATCH]
        ]
        post(chunk)
    return len(signed) + len(orders)


def _lane(url: str, t: int, deadline: int, mode: str, go: Any, out: Any) -> None:
    """One client process: its own keep-alive connection, consumer and worker, lane ``t``."""
    import http.client
    from urllib.parse import urlsplit

    from dk.market.client import RemoteMarket

    with RemoteMarket(url) as rm:
        market_id = rm.market_id
        ((consumer, batch),) = _requests(market_id, deadline, [t])
        batch = [r if r is MATCH else canonical_json(r) for r in batch]  # encoded ahead too
        host = urlsplit(url)
        conn = http.client.HTTPConnection(host.hostname or "127.0.0.1", host.port)
        headers = {"content-type": "application/json"}

        def execute(raw: bytes) -> dict[str, Any]:
            conn.request("POST", "/v1/requests", raw, headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {data[:200]!r}")
            return json.loads(data)

        def post(raws: list[bytes]) -> list[dict[str, Any]]:
            conn.request("POST", "/v1/requests/batch", b"[" + b",".join(raws) + b"]", headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {data[:200]!r}")
            results = json.loads(data)["results"]
            for res in results:
                if "error" in res:
                    raise RuntimeError(str(res["error"]))
            return [res["ok"] for res in results]

        out.put("ready")
        go.wait()
        c0 = time.process_time()
        if mode == "lean":
            n = _drive(execute, consumer, batch)
        elif mode == "batch":
            n = _drive_batched(post, consumer, batch)
        else:  # the library's client: httpx, a dict in, canonical JSON out
            n = _drive(rm.execute, consumer, batch)
        cpu = time.process_time() - c0
        conn.close()
    out.put((n, cpu))


def _validators(execute: Any, market_id: bytes) -> None:
    """Three staked validators (every match draws n = 3 of them); not timed."""
    from dk.market.attest import BlsKey
    from dk.market.validator import registration_request

    for j in range(3):
        c = Client(SigningKey(bytes([200 + j]) * 32), market_id)
        execute(c.request("deposit", amount=10**6))
        execute(registration_request(c, BlsKey.from_seed(bytes([j + 1]) * 32), 100))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _in_process(tmp: Path, deadline: int) -> tuple[float, float]:
    """Ops/s and CPU ms/op of Market.execute in this process (the server's ledger settings)."""
    m = Market.create(tmp / "inproc.db", config=MarketConfig())
    m.ledger.start_checkpoints(1.0)  # as the server runs it
    _validators(m.execute, m.market_id)
    lanes = _requests(m.market_id, deadline)
    for _consumer, batch in lanes:  # encoded ahead, as the HTTP clients do
        batch[:] = [r if r is MATCH else canonical_json(r) for r in batch]
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(_drive(m.execute, consumer, batch) for consumer, batch in lanes)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m.close()
    return n / wall, 1e3 * cpu / n


def _over_http(url: str, pid: int, deadline: int, mode: str) -> tuple[float, float, float]:
    """Ops/s, server CPU ms/op and client CPU ms/op of ``CLIENTS`` lanes in ``mode``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    lanes = [
        ctx.Process(target=_lane, args=(url, t, deadline, mode, go, out)) for t in range(CLIENTS)
    ]
    for p in lanes:
        p.start()
    for _ in lanes:
        assert out.get(timeout=120) == "ready"
    s0, t0 = _cpu_seconds(pid), time.perf_counter()
    go.set()
    done = [out.get(timeout=600) for _ in lanes]
    wall, server_cpu = time.perf_counter() - t0, _cpu_seconds(pid) - s0
    for p in lanes:
        p.join(30)
    n = sum(d[0] for d in done)
    return n / wall, 1e3 * server_cpu / n, 1e3 * sum(d[1] for d in done) / n


def _server(db: Path) -> tuple[Any, str]:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dk.market.server import serve\n"
        "serve(sys.argv[1], port=0, ready=lambda p: print(p, flush=True))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


def main() -> None:
    from dk.market.client import RemoteMarket

    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        deadline = int(time.time()) + 3600
        inproc, inproc_cpu = _in_process(tmp, deadline)
        rows.append(("in-process Market.execute", inproc, f"{inproc_cpu:.2f}"))
        http = 0.0
        # a fresh ledger per mode: the lanes' keys (and so their nonces' accounts) repeat
        for mode, label in (
            ("lean", f"HTTP, single requests ({CLIENTS} procs)"),
            ("remote", f"HTTP, RemoteMarket/httpx ({CLIENTS} procs)"),
            ("batch", f"HTTP, batches of {BATCH} ({CLIENTS} procs)"),
        ):
            db = tmp / f"{mode}.db"
            Market.create(db, config=MarketConfig()).close()
            proc, url = _server(db)
            try:
                with RemoteMarket(url) as rm:
                    _validators(rm.execute, rm.market_id)
                rate, server_cpu, client_cpu = _over_http(url, proc.pid, deadline, mode)
                if mode == "remote":  # the library's client must leave a clean ledger
                    with RemoteMarket(url) as rm:
                        assert rm.audit(check_bls=False).ok
            finally:
                proc.terminate()
                proc.wait(30)
            rows.append((label, rate, f"{server_cpu:.2f} + {client_cpu:.2f}"))
            if mode == "lean":
                http = rate

    load = os.getloadavg()
    print(f"{'path':<40}{'signed ops/s':>13}   CPU ms/op (server + clients)")
    for label, rate, cpu in rows:
        print(f"{label:<40}{rate:>13.0f}   {cpu}")
    print(
        f"HTTP single / in-process = {http / inproc:.2f}; target >= {TARGET:.0f}/s over HTTP "
        f"(single requests): {'MET' if http >= TARGET else 'NOT MET'}"
    )
    print(
        f"clients pre-sign orders and bids; matches are signed in the timed window. "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"(shared machine: compare CPU ms/op across runs, rates within one run)"
    )


if __name__ == "__main__":
    main()
