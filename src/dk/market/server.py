"""``dk market serve``: the market ledger behind an HTTP/JSON API (Starlette on uvicorn).

The server is a thin shell over :class:`dk.market.Market`; every rule stays in the library.
What the server adds (SPEC V §9):

* **It owns the clock.** Every state change is stamped with the server's own time; no
  request can carry one.
* **One writer.** All ledger calls run on one dedicated thread, in arrival order, so a
  state change is one SQLite transaction exactly as in the embedded market.
* **Limits.** A request body is read up to a fixed size (a signed request 512 KiB, a job
  64 KiB, a bundle archive 1 GiB), and each authenticated account has a token bucket.
* **Clear errors.** Every refusal is ``{"error": {"reason": CODE, "message": TEXT}}`` with the
  library's own reason code: 400 malformed (FormatError), 409 refused by the market
  (MarketRefused), 404 unknown, 413 too large, 429 rate limited.

Bundles and jobs reach the server as uploads (``POST /v1/bundles`` a tar read by
:func:`dk.market.transfer.unpack_bundle`; ``POST /v1/jobs`` the job's TOML), stored under the
server's state directory by manifest digest and job id. Custom model files are not uploaded:
a server verifies only jobs it can load itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dk.errors import BackendUnavailable, DkError, FormatError
from dk.market.errors import MarketRefused
from dk.market.market import Market
from dk.market.requests import MAX_REQUEST, parse_request
from dk.market.results import read_manifest
from dk.market.transfer import MAX_BUNDLE_BYTES, unpack_bundle

MAX_JOB = 64 * 1024
MAX_WAIT_S = 30.0
MAX_EVENTS = 1000
API_VERSION = "v1"


@dataclass
class RateLimit:
    """A token bucket per account: ``rate`` requests per second, bursts up to ``burst``."""

    rate: float = 2000.0
    burst: float = 4000.0


class _Buckets:
    def __init__(self, limit: RateLimit, clock: Callable[[], float]) -> None:
        self.limit, self.clock = limit, clock
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, account: str) -> bool:
        now = self.clock()
        with self._lock:
            tokens, last = self._state.get(account, (self.limit.burst, now))
            tokens = min(self.limit.burst, tokens + (now - last) * self.limit.rate)
            if tokens < 1.0:
                self._state[account] = (tokens, now)
                return False
            self._state[account] = (tokens - 1.0, now)
            return True


class HttpError(Exception):
    """A refusal the server answers with ``status`` and the body ``{"error": {...}}``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class MarketService:
    """The server's state: one market opened on one writer thread, and its upload store.

    Args:
        db: the ledger file (created beforehand with ``dk market init``).
        state_dir: where uploaded jobs and bundles are kept (``jobs/``, ``bundles/``).
        clock: injected time, accepted only by a ledger created with ``clock = "test"``;
            otherwise the market keeps its own (the server's) clock. Never a client's.
        rate: per-account token bucket.
        job_loader: how a job id becomes a job (default: the uploaded ``job.toml``).
        market_kwargs: passed to :class:`Market` (test doubles for verify/replay/BLS).
    """

    def __init__(
        self,
        db: str | Path,
        *,
        state_dir: str | Path,
        clock: Callable[[], int] | None = None,
        rate: RateLimit | None = None,
        job_loader: Callable[[str], Any] | None = None,
        **market_kwargs: Any,
    ) -> None:
        self._job_loader = job_loader
        self.state_dir = Path(state_dir)
        (self.state_dir / "jobs").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "bundles").mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dk-market-writer")
        self.market: Market = self._pool.submit(Market, db, clock=clock, **market_kwargs).result()
        self.market_id = self.market.market_id
        self._buckets = _Buckets(rate or RateLimit(), time.monotonic)
        self._changed = asyncio.Event()

    def now(self) -> int:
        """The server's (the market's own) time in integer seconds."""
        return self.market.now()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the writer thread (the only thread that touches the ledger)."""
        fut = self._pool.submit(fn, *args, **kwargs)
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        """Close the ledger and stop the writer thread."""
        self._pool.submit(self.market.close).result()
        self._pool.shutdown(wait=True)

    # -- state changes ------------------------------------------------------------------

    def execute(self, raw: bytes) -> dict[str, Any]:
        """Authenticate, rate-limit and apply one signed request (writer thread)."""
        req = parse_request(raw, market_id=self.market_id)
        if not self._buckets.take(req.account):
            raise HttpError(429, "RATE_LIMITED", f"account {req.account[:16]}… is over its rate")
        return self.market.apply(req)  # authenticated once, above

    def store_job(self, text: bytes) -> dict[str, Any]:
        """Keep an uploaded job (its TOML) under its job id."""
        from dk.pol.job import parse_job

        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("job is not UTF-8", reason="JOB_MALFORMED") from None
        job = parse_job(decoded, base_dir=self.state_dir / "jobs")
        job_id = bytes(job.job_id).hex()
        target = self.state_dir / "jobs" / f"{job_id}.toml"
        _atomic_write(target, text)
        return {"job_id": job_id}

    def job(self, job_id: str) -> Any:
        """The stored job ``job_id``."""
        from dk.pol.job import load_job

        if self._job_loader is not None:
            return self._job_loader(job_id)
        path = self.state_dir / "jobs" / f"{job_id}.toml"
        if not _is_hex64(job_id) or not path.is_file():
            raise HttpError(409, "JOB_UNKNOWN", f"the server holds no job {job_id[:16]}…")
        return load_job(path)

    def store_bundle(self, data: bytes) -> dict[str, Any]:
        """Unpack an uploaded bundle archive and keep it under its manifest digest."""
        tmp = Path(tempfile.mkdtemp(dir=self.state_dir / "bundles", prefix=".upload-"))
        try:
            unpack_bundle(data, tmp / "b")
            manifest, digest = read_manifest(tmp / "b")
            target = self.state_dir / "bundles" / digest.hex()
            if not target.exists():
                os.replace(tmp / "b", target)
            return {
                "manifest_digest": digest.hex(),
                "transcript_root": manifest["transcript_root"],
            }
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def bundle_dir(self, manifest_digest: str) -> Path:
        """Where the uploaded bundle ``manifest_digest`` is kept."""
        path = self.state_dir / "bundles" / manifest_digest
        if not _is_hex64(manifest_digest) or not path.is_dir():
            raise HttpError(
                409, "BUNDLE_UNKNOWN", f"the server holds no bundle {manifest_digest[:16]}…"
            )
        return path

    def verify(self, order_id: str) -> dict[str, Any]:
        """The market's own verification of the bundle committed for ``order_id``."""
        order = self.market.order(order_id)
        if not order["commitment"]:
            raise MarketRefused("BAD_STATE", f"{order_id} has no committed result")
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.verify_result(
            order_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    def resolve(self, challenge_id: str) -> dict[str, Any]:
        """Decide a challenge by replaying the disputed interval of the committed bundle."""
        row = self.market.ledger.con.execute(
            "SELECT order_id FROM challenges WHERE challenge_id = ?", (challenge_id,)
        ).fetchone()
        if row is None:
            raise MarketRefused("UNKNOWN_CHALLENGE", f"no challenge {challenge_id}")
        order = self.market.order(row[0])
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.resolve_challenge(
            challenge_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    def resolve_whistle(self, whistle_id: str) -> dict[str, Any]:
        """Decide a whistle by replaying its interval of the committed bundle (SPEC V §13)."""
        row = self.market.ledger.con.execute(
            "SELECT order_id FROM whistles WHERE whistle_id = ?", (whistle_id,)
        ).fetchone()
        if row is None:
            raise MarketRefused("UNKNOWN_WHISTLE", f"no whistle {whistle_id}")
        order = self.market.order(row[0])
        digest = json.loads(order["commitment"])["manifest_digest"]
        return self.market.resolve_whistle(
            whistle_id, self.bundle_dir(digest), self.job(order["job_id"])
        )

    # -- reads --------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The market's identity, configuration, head and the server's time."""
        seq, head = self.market.ledger.head()
        return {
            "api": API_VERSION,
            "market_id": self.market_id.hex(),
            "config": self.market.config.to_dict(),
            "seq": seq,
            "head": head.hex(),
            "now": self.now(),
        }

    def events(self, after: int, limit: int) -> dict[str, Any]:
        """Events with ``seq > after`` (at most ``limit``), each with its hashes and body."""
        rows = self.market.ledger.con.execute(
            "SELECT seq, prev_hash, hash, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        ).fetchall()
        seq, head = self.market.ledger.head()
        return {
            "events": [
                {
                    "seq": int(r[0]),
                    "prev_hash": bytes(r[1]).hex(),
                    "hash": bytes(r[2]).hex(),
                    "body": json.loads(bytes(r[3])),
                }
                for r in rows
            ],
            "seq": seq,
            "head": head.hex(),
        }


def _is_hex64(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- the ASGI app ---------------------------------------------------------------------------


def create_app(service: MarketService) -> Any:
    """The Starlette application over ``service`` (routes listed in :data:`OPENAPI`)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(status: int, reason: str, message: str) -> JSONResponse:
        return JSONResponse({"error": {"reason": reason, "message": message}}, status)

    async def read_body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, "TOO_LARGE", f"request body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def endpoint(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def wrapped(request: Request) -> JSONResponse:
            try:
                return JSONResponse(await fn(request))
            except HttpError as e:
                return error(e.status, e.reason, e.message)
            except MarketRefused as e:
                return error(409, e.reason, str(e))
            except FormatError as e:
                return error(400, e.reason or "MALFORMED", str(e))
            except DkError as e:
                return error(400, "MALFORMED", str(e))

        return wrapped

    async def changed() -> None:
        service._changed.set()
        service._changed = asyncio.Event()

    @endpoint
    async def info(request: Request) -> Any:
        return await service.run(service.info)

    @endpoint
    async def post_request(request: Request) -> Any:
        raw = await read_body(request, MAX_REQUEST)
        out = await service.run(service.execute, raw)
        await changed()
        return out

    @endpoint
    async def post_job(request: Request) -> Any:
        return await service.run(service.store_job, await read_body(request, MAX_JOB))

    @endpoint
    async def post_bundle(request: Request) -> Any:
        data = await read_body(request, MAX_BUNDLE_BYTES)
        return await asyncio.to_thread(service.store_bundle, data)

    @endpoint
    async def orders(request: Request) -> Any:
        return await service.run(service.market.book)

    @endpoint
    async def order(request: Request) -> Any:
        return await service.run(service.market.show, request.path_params["order_id"])

    @endpoint
    async def order_row(request: Request) -> Any:
        row = await service.run(service.market.order, request.path_params["order_id"])
        return dict(row)

    @endpoint
    async def explain(request: Request) -> Any:
        raw = request.query_params.get("intervals")
        if raw is not None and not (raw.isdigit() and 0 < int(raw) <= 10**9):
            raise HttpError(400, "BAD_PARAMS", "intervals must be a positive integer")
        oid = request.path_params["order_id"]
        m = None if raw is None else int(raw)
        return await service.run(lambda: service.market.explain(oid, intervals=m))

    @endpoint
    async def redraw(request: Request) -> Any:
        out = await service.run(service.market.redraw, request.path_params["order_id"])
        await changed()
        return out

    @endpoint
    async def balance(request: Request) -> Any:
        account = request.path_params["account"]
        if not _is_hex64(account):
            raise HttpError(400, "BAD_PARAMS", "account must be 64 lowercase hex characters")
        return {"account": account, "balance": await service.run(service.market.balance, account)}

    def market_action(name: str) -> Callable[[Request], Any]:
        @endpoint
        async def act(request: Request) -> Any:
            oid = request.path_params["order_id"]
            if name == "verify":
                out = await service.run(service.verify, oid)
            elif name == "accept":
                out = await service.run(service.market.accept, oid)
            else:
                out = await service.run(service.market.settle, oid)
            await changed()
            return out

        return act

    @endpoint
    async def resolve(request: Request) -> Any:
        out = await service.run(service.resolve, request.path_params["challenge_id"])
        await changed()
        return out

    @endpoint
    async def resolve_whistle(request: Request) -> Any:
        out = await service.run(service.resolve_whistle, request.path_params["whistle_id"])
        await changed()
        return out

    @endpoint
    async def treasury(request: Request) -> Any:
        return await service.run(service.market.treasury)

    @endpoint
    async def events(request: Request) -> Any:
        try:
            after = int(request.query_params.get("after", "-1"))
            limit = min(int(request.query_params.get("limit", "100")), MAX_EVENTS)
            wait = min(float(request.query_params.get("wait", "0")), MAX_WAIT_S)
        except ValueError:
            raise HttpError(400, "BAD_PARAMS", "after, limit and wait must be numbers") from None
        if limit < 1 or wait < 0:
            raise HttpError(400, "BAD_PARAMS", "limit must be >= 1 and wait >= 0")
        deadline = time.monotonic() + wait
        while True:
            waiter = service._changed
            out = await service.run(service.events, after, limit)
            left = deadline - time.monotonic()
            if out["events"] or left <= 0:
                return out
            try:
                await asyncio.wait_for(waiter.wait(), timeout=left)
            except TimeoutError:
                pass

    @endpoint
    async def audit(request: Request) -> Any:
        check_bls = request.query_params.get("bls", "1") != "0"
        rep = await service.run(lambda: service.market.audit(check_bls=check_bls))
        return rep.to_dict()

    @endpoint
    async def openapi(request: Request) -> Any:
        return OPENAPI

    routes = [
        Route("/v1/market", info, methods=["GET"]),
        Route("/v1/requests", post_request, methods=["POST"]),
        Route("/v1/jobs", post_job, methods=["POST"]),
        Route("/v1/bundles", post_bundle, methods=["POST"]),
        Route("/v1/orders", orders, methods=["GET"]),
        Route("/v1/orders/{order_id}", order, methods=["GET"]),
        Route("/v1/orders/{order_id}/row", order_row, methods=["GET"]),
        Route("/v1/orders/{order_id}/explain", explain, methods=["GET"]),
        Route("/v1/orders/{order_id}/redraw", redraw, methods=["POST"]),
        Route("/v1/orders/{order_id}/verify", market_action("verify"), methods=["POST"]),
        Route("/v1/orders/{order_id}/accept", market_action("accept"), methods=["POST"]),
        Route("/v1/orders/{order_id}/settle", market_action("settle"), methods=["POST"]),
        Route("/v1/challenges/{challenge_id}/resolve", resolve, methods=["POST"]),
        Route("/v1/whistles/{whistle_id}/resolve", resolve_whistle, methods=["POST"]),
        Route("/v1/treasury", treasury, methods=["GET"]),
        Route("/v1/balances/{account}", balance, methods=["GET"]),
        Route("/v1/events", events, methods=["GET"]),
        Route("/v1/audit", audit, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return error(404, "NOT_FOUND", f"no route {request.method} {request.url.path}")

    async def bad_method(request: Request, exc: Exception) -> JSONResponse:
        return error(405, "METHOD_NOT_ALLOWED", f"{request.method} not allowed here")

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method})


def _op(summary: str, *, body: str | None = None, params: list[str] | None = None) -> dict:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "the result as JSON"},
            "400": {"description": "malformed input", "content": _ERR},
            "409": {"description": "refused by the market", "content": _ERR},
        },
    }
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in params
        ]
    if body:
        op["requestBody"] = {"required": True, "content": {body: {"schema": {}}}}
    return op


_ERR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "dk market", "version": API_VERSION},
    "paths": {
        "/v1/market": {"get": _op("market id, config, head and the server's time")},
        "/v1/requests": {
            "post": _op("apply one signed request envelope (SPEC V §2)", body="application/json")
        },
        "/v1/jobs": {"post": _op("upload a job (TOML); returns its job_id", body="text/plain")},
        "/v1/bundles": {"post": _op("upload a bundle as a tar archive", body="application/x-tar")},
        "/v1/orders": {"get": _op("all orders and bids")},
        "/v1/orders/{order_id}": {
            "get": _op("one order, why each bid matched or not", params=["order_id"])
        },
        "/v1/orders/{order_id}/row": {
            "get": _op(
                "the order's ledger row as stored (JSON fields as text)", params=["order_id"]
            )
        },
        "/v1/orders/{order_id}/explain": {
            "get": {
                **_op("the order's challenge policy explained (SPEC V §10)", params=["order_id"]),
                "parameters": [
                    {
                        "name": "order_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "intervals",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer"},
                    },
                ],
            }
        },
        "/v1/orders/{order_id}/redraw": {
            "post": _op("replace drawn validators that withheld their share", params=["order_id"])
        },
        "/v1/orders/{order_id}/verify": {
            "post": _op("the market's verification of the committed bundle", params=["order_id"])
        },
        "/v1/orders/{order_id}/accept": {
            "post": _op("accept with k attestations", params=["order_id"])
        },
        "/v1/orders/{order_id}/settle": {
            "post": _op("release or refund as the server's clock says", params=["order_id"])
        },
        "/v1/challenges/{challenge_id}/resolve": {
            "post": _op("replay the disputed interval", params=["challenge_id"])
        },
        "/v1/whistles/{whistle_id}/resolve": {
            "post": _op(
                "replay a whistle's interval: slash the attesters or forfeit the deposit",
                params=["whistle_id"],
            )
        },
        "/v1/treasury": {"get": _op("the treasury's inflows, outflows and balance")},
        "/v1/balances/{account}": {"get": _op("free balance of an account", params=["account"])},
        "/v1/events": {
            "get": {
                **_op("events after a sequence number; long-poll with wait (s, ≤ 30)"),
                "parameters": [
                    {"name": n, "in": "query", "required": False, "schema": {"type": t}}
                    for n, t in (("after", "integer"), ("limit", "integer"), ("wait", "number"))
                ],
            }
        },
        "/v1/audit": {"get": _op("re-check the chain, signatures and conservation")},
    },
    "components": {
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["reason", "message"],
                        "properties": {
                            "reason": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    }
                },
            }
        }
    },
}


def serve(
    db: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    state_dir: str | Path | None = None,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Run the server until interrupted (what ``dk market serve`` calls).

    Args:
        db: the ledger file.
        host, port: where to listen (port 0 picks a free one).
        state_dir: uploads (default: ``<db>.d`` beside the ledger).
        ready: called with the bound port once the server listens.
    """
    try:
        import uvicorn
    except ImportError:
        raise BackendUnavailable("the market server needs: pip install 'dk-pol[server]'") from None
    from dk.market.store import is_url

    default_state = Path("market-state") if is_url(db) else Path(f"{db}.d")
    service = MarketService(db, state_dir=state_dir or default_state)
    config = uvicorn.Config(
        create_app(service), host=host, port=port, log_level="warning", ws="none"
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if ready is not None and server.started:
            ready(server.servers[0].sockets[0].getsockname()[1])
        await task

    try:
        asyncio.run(main())
    finally:
        service.close()


if __name__ == "__main__":  # python -m dk.market.server --openapi > docs/openapi.json
    import sys

    if sys.argv[1:] == ["--openapi"]:
        print(json.dumps(OPENAPI, indent=2, sort_keys=True))
    else:
        print("usage: python -m dk.market.server --openapi  (run the server: dk market serve)")
        raise SystemExit(2)
