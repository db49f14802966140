"""``dk market …``: a thin CLI over :mod:`dk.market` (one library call per command).

Every command takes ``--db`` (default ``$DK_MARKET_DB`` or ``market.db``) and ``--now`` (integer
seconds; default the wall clock) and prints the outcome, or JSON with ``--json``. A refusal by
the market exits 1 with its reason code.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import click

from dk.cli.app import App
from dk.cli.exit_codes import ExitCode


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --db/--now/--json and map market refusals to exit code 1."""

    @click.option(
        "--db",
        envvar="DK_MARKET_DB",
        default="market.db",
        show_default=True,
        type=click.Path(dir_okay=False),
        help="Ledger file (SQLite).",
    )
    @click.option(
        "--now",
        type=click.IntRange(0),
        default=None,
        help="Time in integer seconds (default: now).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    @click.pass_obj
    @functools.wraps(fn)
    def wrapper(app: App, db: str, now: int | None, as_json: bool, **kw: Any) -> None:
        from dk.market import MarketRefused

        try:
            out = fn(db=db, now=int(time.time()) if now is None else now, **kw)
        except MarketRefused as e:
            app.abort(str(e), ExitCode.REJECTED)
        if as_json:
            app.emit_json(out)
        else:
            _render(app, out)

    return wrapper


def _render(app: App, out: Any) -> None:
    if isinstance(out, dict):
        for k in sorted(out):
            v = out[k]
            if isinstance(v, list) and v and isinstance(v[0], dict):
                app.print(f"{k}:")
                for row in v:
                    app.print("  " + "  ".join(f"{a}={b}" for a, b in row.items()))
            else:
                app.print(f"{k}: {v}")
    else:
        app.print(str(out))


def _open(db: str) -> Any:
    from dk.market import Market

    return Market(db)


def _signed(db: str, keyfile: str, action: str, now: int, **params: Any) -> dict[str, Any]:
    from dk.crypto.keys import load_signing_key
    from dk.market import Client

    with _open(db) as m:
        req = Client(load_signing_key(keyfile), m.market_id).request(action, **params)
        return m.execute(req, now=now)


def _tags(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        k, sep, x = v.partition("=")
        if not sep:
            raise click.BadParameter(f"tag {v!r} must be KEY=VALUE")
        out[k] = x
    return out


def _job(path: str) -> Any:
    from dk.pol import load_job

    return load_job(path)


KEY = click.option(
    "--key",
    "keyfile",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The acting account's Ed25519 secret key file.",
)


@click.group(short_help="Orders, bids, escrow, results, challenges, audit")
def market() -> None:
    """A small market that pays only for verified training (spec: SPEC.md Part V)."""


@market.command(short_help="Create a ledger")
@click.option(
    "--k",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Default validator attestations needed.",
)
@click.option(
    "--window",
    type=click.IntRange(0),
    default=3600,
    show_default=True,
    help="Default challenge window (s).",
)
@click.option("--samples", type=click.IntRange(0), default=2, show_default=True)
@click.option("--topq", type=click.IntRange(0), default=1, show_default=True)
@click.option("--min-bond", type=click.IntRange(1), default=1, show_default=True)
@_common
def init(db: str, now: int, **config: int) -> dict[str, Any]:
    """Create a new market ledger at --db."""
    from dk.market import Market, MarketConfig

    with Market.create(db, now=now, config=MarketConfig(**config)) as m:
        return {"market_id": m.market_id.hex(), "db": db}


@market.command(short_help="Deposit into an account")
@KEY
@click.argument("amount", type=click.IntRange(1))
@_common
def deposit(db: str, now: int, keyfile: str, amount: int) -> dict[str, Any]:
    """Credit AMOUNT to the key's account."""
    return _signed(db, keyfile, "deposit", now, amount=amount)


@market.command(short_help="Withdraw from an account")
@KEY
@click.argument("amount", type=click.IntRange(1))
@_common
def withdraw(db: str, now: int, keyfile: str, amount: int) -> dict[str, Any]:
    """Pay AMOUNT of the key's free balance out of the market."""
    return _signed(db, keyfile, "withdraw", now, amount=amount)


@market.command(short_help="Transfer to another account")
@KEY
@click.option("--to", required=True, help="Recipient public key (64 hex).")
@click.argument("amount", type=click.IntRange(1))
@_common
def transfer(db: str, now: int, keyfile: str, to: str, amount: int) -> dict[str, Any]:
    """Move AMOUNT from the key's account to --to."""
    return _signed(db, keyfile, "transfer", now, to=to, amount=amount)


@market.command(short_help="Place an order (locks the payment)")
@KEY
@click.option("--job", "job_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--max-price", type=click.IntRange(1), required=True)
@click.option("--min-stake", type=click.IntRange(0), default=0, show_default=True)
@click.option("--deadline", type=click.IntRange(1), required=True, help="Seconds from --now.")
@click.option("--tag", "tag", multiple=True, help="Condition KEY=VALUE (repeatable).")
@click.option("--k", type=click.IntRange(1, 64), default=None)
@click.option("--window", type=click.IntRange(0), default=None)
@_common
def order(
    db: str,
    now: int,
    keyfile: str,
    job_path: str,
    max_price: int,
    min_stake: int,
    deadline: int,
    tag: tuple[str, ...],
    k: int | None,
    window: int | None,
) -> dict[str, Any]:
    """Order the job in --job, escrowing --max-price."""
    policy = {n: v for n, v in (("k", k), ("window", window)) if v is not None}
    return _signed(
        db,
        keyfile,
        "order",
        now,
        job_id=_job(job_path).job_id.hex(),
        max_price=max_price,
        min_stake=min_stake,
        deadline=now + deadline,
        policy=policy,
        tags=_tags(tag),
    )


@market.command(short_help="Place a bid (locks the stake)")
@KEY
@click.option("--price", type=click.IntRange(1), required=True)
@click.option("--capacity", type=click.IntRange(1), default=1, show_default=True)
@click.option("--stake", type=click.IntRange(0), default=0, show_default=True, help="Per job.")
@click.option("--tag", "tag", multiple=True, help="Offer KEY=VALUE (repeatable).")
@_common
def bid(
    db: str, now: int, keyfile: str, price: int, capacity: int, stake: int, tag: tuple[str, ...]
) -> dict[str, Any]:
    """Offer CAPACITY jobs at PRICE, staking STAKE per job."""
    return _signed(
        db, keyfile, "bid", now, price=price, capacity=capacity, stake=stake, tags=_tags(tag)
    )


@market.command(short_help="Match an order with the best bid")
@KEY
@click.argument("order_id")
@_common
def match(db: str, now: int, keyfile: str, order_id: str) -> dict[str, Any]:
    """Match your ORDER_ID with the best eligible bid."""
    return _signed(db, keyfile, "match", now, order_id=order_id)


@market.command(short_help="Show an order (and why bids did not match) or the book")
@click.argument("order_id", required=False)
@_common
def show(db: str, now: int, order_id: str | None) -> dict[str, Any]:
    """Show ORDER_ID with the reason each bid did not match, or the whole book."""
    with _open(db) as m:
        return m.show(order_id) if order_id else m.book()


@market.command(short_help="Commit to a bundle for a matched order")
@KEY
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@_common
def submit(db: str, now: int, keyfile: str, order_id: str, bundle: str) -> dict[str, Any]:
    """Submit BUNDLE's commitment for ORDER_ID."""
    from dk.market import bundle_commitment

    return _signed(db, keyfile, "submit", now, order_id=order_id, **bundle_commitment(bundle))


@market.command("verify", short_help="Run the market's verification of a result")
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--job", "job_path", required=True, type=click.Path(exists=True, dir_okay=False))
@_common
def verify_cmd(db: str, now: int, order_id: str, bundle: str, job_path: str) -> dict[str, Any]:
    """Verify BUNDLE for ORDER_ID with the ledger's beacon; reject and refund on failure."""
    with _open(db) as m:
        return m.verify_result(order_id, bundle, _job(job_path), now=now)


@market.command("bls-keygen", short_help="Create a validator BLS key")
@click.argument("path", type=click.Path(dir_okay=False))
@_common
def bls_keygen(db: str, now: int, path: str) -> dict[str, Any]:
    """Write a new BLS secret key to PATH (mode 0600)."""
    from dk.market import BlsKey

    key = BlsKey.generate()
    key.save(path)
    return {"path": path, "bls_pk": key.pk.hex()}


@market.command("register-validator", short_help="Register as a validator")
@KEY
@click.option("--bls-key", required=True, type=click.Path(exists=True, dir_okay=False))
@_common
def register_validator(db: str, now: int, keyfile: str, bls_key: str) -> dict[str, Any]:
    """Register the key's account with a BLS key and its proof of possession."""
    from dk.crypto.keys import load_signing_key
    from dk.market import BlsKey, Client
    from dk.market.validator import registration_request

    with _open(db) as m:
        client = Client(load_signing_key(keyfile), m.market_id)
        return m.execute(registration_request(client, BlsKey.load(bls_key)), now=now)


@market.command(short_help="Verify a result yourself and attest it")
@KEY
@click.option("--bls-key", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--job", "job_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@_common
def attest(
    db: str, now: int, keyfile: str, bls_key: str, job_path: str, order_id: str, bundle: str
) -> dict[str, Any]:
    """Re-run the verifier on BUNDLE and sign an attestation for ORDER_ID."""
    from dk.crypto.keys import load_signing_key
    from dk.market import BlsKey, Client
    from dk.market.validator import attestation_request

    with _open(db) as m:
        client = Client(load_signing_key(keyfile), m.market_id)
        req = attestation_request(m, client, BlsKey.load(bls_key), order_id, bundle, _job(job_path))
        return m.execute(req, now=now)


@market.command(short_help="Accept a verified result with k attestations")
@click.argument("order_id")
@_common
def accept(db: str, now: int, order_id: str) -> dict[str, Any]:
    """Aggregate the attestations of ORDER_ID and open its challenge window."""
    with _open(db) as m:
        return m.accept(order_id, now=now)


@market.command(short_help="Challenge an accepted result (posts a bond)")
@KEY
@click.argument("order_id")
@click.option("--bond", type=click.IntRange(1), required=True)
@click.option("--interval", type=click.IntRange(0), default=None, help="Disputed interval.")
@click.option(
    "--counter",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Your own bundle: bisection finds the disputed interval.",
)
@_common
def challenge(
    db: str,
    now: int,
    keyfile: str,
    order_id: str,
    bond: int,
    interval: int | None,
    counter: str | None,
) -> dict[str, Any]:
    """Dispute ORDER_ID naming --interval or giving a --counter transcript."""
    if (interval is None) == (counter is None):
        raise click.UsageError("give exactly one of --interval and --counter")
    params: dict[str, Any] = {"order_id": order_id, "bond": bond}
    if counter is not None:
        from dk.market.results import read_manifest

        params["counter_roots"] = [c["root"] for c in read_manifest(counter)[0]["checkpoints"]]
    else:
        params["interval"] = interval
    return _signed(db, keyfile, "challenge", now, **params)


@market.command(short_help="Decide a challenge by replay")
@click.argument("challenge_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--job", "job_path", required=True, type=click.Path(exists=True, dir_okay=False))
@_common
def resolve(db: str, now: int, challenge_id: str, bundle: str, job_path: str) -> dict[str, Any]:
    """Replay the interval CHALLENGE_ID disputes from the committed BUNDLE."""
    with _open(db) as m:
        return m.resolve_challenge(challenge_id, bundle, _job(job_path), now=now)


@market.command(short_help="Release or refund an order")
@click.argument("order_id")
@_common
def settle(db: str, now: int, order_id: str) -> dict[str, Any]:
    """Release ORDER_ID to the worker after its window, or refund it on expiry/timeout."""
    with _open(db) as m:
        return m.settle(order_id, now=now)


@market.command(short_help="Re-check the chain, signatures and conservation")
@click.option("--no-bls", is_flag=True, help="Skip the (slow) BLS re-checks.")
@_common
def audit(db: str, now: int, no_bls: bool) -> dict[str, Any]:
    """Audit the whole ledger; exit 1 if anything is wrong."""
    with _open(db) as m:
        report = m.audit(check_bls=not no_bls)
    if not report.ok:
        from dk.market import MarketRefused

        raise MarketRefused("AUDIT_FAILED", "; ".join(report.problems[:5]))
    return report.to_dict()
