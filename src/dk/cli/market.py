"""``dk market …``: a thin CLI over :mod:`dk.market` (one library call per command).

Every command takes ``--db`` (default ``$DK_MARKET_DB`` or ``market.db``) and prints the
outcome, or JSON with ``--json``. A refusal by the market exits 1 with its reason code.

Time belongs to the ledger, never to a party (SPEC Part V §3.1): ``--now`` is accepted only by a
ledger created with ``dk market init --clock test``; any other ledger refuses it (exit 2). A
verification or dispute replay that could not decide is recorded and exits 5 (inconclusive).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, cast

import click

from dk.cli.app import App, FiniteRange, worker_hex
from dk.cli.exit_codes import ExitCode

_URL: contextvars.ContextVar[str | None] = contextvars.ContextVar("dk_market_url", default=None)


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --db/--url/--now/--json and map market refusals to exit code 1."""

    @click.option(
        "--db",
        envvar="DK_MARKET_DB",
        default="market.db",
        show_default=True,
        type=click.Path(dir_okay=False),
        help="Ledger file (SQLite).",
    )
    @click.option(
        "--url",
        envvar="DK_MARKET_URL",
        default=None,
        help="A market server (dk market serve) instead of a local ledger file.",
    )
    @click.option(
        "--now",
        type=click.IntRange(0),
        default=None,
        help="Test ledgers (init --clock test) only: the time in integer seconds.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    @click.pass_obj
    @functools.wraps(fn)
    def wrapper(
        app: App, db: str, url: str | None, now: int | None, as_json: bool, **kw: Any
    ) -> None:
        from dk.market import MarketRefused

        _URL.set(url)
        try:
            out = fn(db=db, now=now, **kw)
        except MarketRefused as e:
            if e.reason == "CLOCK_LOCKED":
                app.abort(str(e), ExitCode.USAGE)
            if e.reason == "REPORT_INCONCLUSIVE":
                app.abort(str(e), ExitCode.INCONCLUSIVE)
            app.abort(str(e), ExitCode.REJECTED)
        if as_json:
            app.emit_json(out)
        else:
            _render(app, out)
        if isinstance(out, dict) and out.get("verdict") == "inconclusive":
            raise SystemExit(int(ExitCode.INCONCLUSIVE))  # recorded; nothing moved (SPEC V §5.4)

    return wrapper


def _render(app: App, out: Any) -> None:
    if hasattr(out, "__rich__"):
        app.print(out)
    elif isinstance(out, dict):
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


def _clock(now: int | None) -> Callable[[], int] | None:
    return None if now is None else (lambda: now)


def _open(db: str, now: int | None) -> Any:
    from dk.market.client import open_market

    return open_market(db, url=_URL.get(), clock=_clock(now))


def _client(m: Any, keyfile: str) -> Any:
    from dk.crypto.keys import load_signing_key
    from dk.market import Client

    return Client(load_signing_key(keyfile), m.market_id)


def _signed(db: str, keyfile: str, action: str, now: int | None, **params: Any) -> dict[str, Any]:
    with _open(db, now) as m:
        return m.execute(_client(m, keyfile).request(action, **params))


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
@click.option(
    "--samples",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="Fewest uniformly sampled intervals a verification replays (floor of the economic "
    "default, SPEC V §10).",
)
@click.option(
    "--topq",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Default largest-update intervals per epoch a verification adds.",
)
@click.option(
    "--min-bond",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Smallest bond a challenger must post.",
)
@click.option(
    "--n",
    type=click.IntRange(1, 64),
    default=3,
    show_default=True,
    help="Default validators drawn per order (raised to --k if smaller).",
)
@click.option(
    "--min-validator-stake",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Stake a validator must lock to register and to be drawn.",
)
@click.option(
    "--share-timeout",
    type=click.IntRange(0),
    default=600,
    show_default=True,
    help="Seconds a drawn validator has to post its beacon share.",
)
@click.option(
    "--withhold-penalty",
    type=click.IntRange(0),
    default=10,
    show_default=True,
    help="Taken from a validator that withholds its share.",
)
@click.option(
    "--min-profiles",
    type=click.IntRange(1, 64),
    default=3,
    show_default=True,
    help="Profiles a profiled order's tolerance needs at least (SPEC V §12).",
)
@click.option(
    "--clock",
    type=click.Choice(["system", "test"]),
    default="system",
    show_default=True,
    help="system: the ledger keeps its own time; test: --now is accepted (tests only).",
)
@_common
def init(db: str, now: int | None, n: int, **config: Any) -> dict[str, Any]:
    """Create a new market ledger at --db."""
    from dk.market import Market, MarketConfig

    if _URL.get():
        raise click.UsageError("init creates a local ledger; a server's ledger exists already")
    cfg = MarketConfig(n=max(n, config["k"]), **config)
    with Market.create(db, config=cfg, clock=_clock(now)) as m:
        return {"market_id": m.market_id.hex(), "db": db, "clock": cfg.clock}


@market.command(short_help="Deposit into an account")
@KEY
@click.argument("amount", type=click.IntRange(1))
@_common
def deposit(db: str, now: int | None, keyfile: str, amount: int) -> dict[str, Any]:
    """Credit AMOUNT to the key's account."""
    return _signed(db, keyfile, "deposit", now, amount=amount)


@market.command(short_help="Withdraw from an account")
@KEY
@click.argument("amount", type=click.IntRange(1))
@_common
def withdraw(db: str, now: int | None, keyfile: str, amount: int) -> dict[str, Any]:
    """Pay AMOUNT of the key's free balance out of the market."""
    return _signed(db, keyfile, "withdraw", now, amount=amount)


@market.command(short_help="Transfer to another account")
@KEY
@click.option("--to", required=True, help="Recipient public key (64 hex).")
@click.argument("amount", type=click.IntRange(1))
@_common
def transfer(db: str, now: int | None, keyfile: str, to: str, amount: int) -> dict[str, Any]:
    """Move AMOUNT from the key's account to --to."""
    return _signed(db, keyfile, "transfer", now, to=to, amount=amount)


@market.command(short_help="Place an order (locks the payment and the verification fee)")
@KEY
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The job.toml to order (the order records its job_id).",
)
@click.option(
    "--max-price",
    type=click.IntRange(1),
    default=None,
    help="The most the worker is paid (default with --gflop-price: the training's work).",
)
@click.option(
    "--min-stake",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Least per-job stake a bid must lock to match.",
)
@click.option(
    "--deadline", type=click.IntRange(1), required=True, help="Seconds from the market's now."
)
@click.option("--tag", "tag", multiple=True, help="Condition KEY=VALUE (repeatable).")
@click.option(
    "--k",
    type=click.IntRange(1, 64),
    default=None,
    help="Validator attestations acceptance needs (default: the market's).",
)
@click.option(
    "--window",
    type=click.IntRange(0),
    default=None,
    help="Challenge window after acceptance, in seconds (default: the market's).",
)
@click.option(
    "--profiles",
    type=click.IntRange(0, 64),
    default=None,
    help="Tolerant jobs: validators' profiles the tolerance needs (median; SPEC V §12).",
)
@click.option(
    "--gflop-price",
    type=FiniteRange(min=0, min_open=True),
    default=None,
    help="Estimate the work (SPEC V §11) and lock the verification fee it implies.",
)
@click.option("--fee", type=click.IntRange(1), default=None, help="Verification fee to lock.")
@click.option(
    "--fee-intervals",
    type=click.IntRange(1),
    default=None,
    help="The challenged intervals --fee pays for (the excess is refunded at release).",
)
@_common
def order(
    db: str,
    now: int | None,
    keyfile: str,
    job_path: str,
    max_price: int | None,
    min_stake: int,
    deadline: int,
    tag: tuple[str, ...],
    k: int | None,
    window: int | None,
    profiles: int | None,
    gflop_price: float | None,
    fee: int | None,
    fee_intervals: int | None,
) -> dict[str, Any]:
    """Order the job in --job, escrowing --max-price and the verification fee (a cluster of
    the job's train.world_size workers when it is above 1: SPEC Part V §14)."""
    from dk.market.cluster import job_world_size

    policy = {
        n: v for n, v in (("k", k), ("window", window), ("profiles", profiles)) if v is not None
    }
    if (fee is None) != (fee_intervals is None):
        raise click.UsageError("give both --fee and --fee-intervals, or neither")
    if gflop_price is not None and fee is not None:
        raise click.UsageError("--gflop-price estimates the fee: give it or --fee, not both")
    if max_price is None and gflop_price is None:
        raise click.UsageError("give --max-price, or --gflop-price to price the job's work")
    job = _job(job_path)
    cluster = {"world_size": job_world_size(job)} if job_world_size(job) > 1 else {}
    with _open(db, now) as m:
        quote = None
        if gflop_price is not None:
            from dk.market.work import order_quote

            cfg = m.config
            quote = order_quote(
                job,
                gflop_price=gflop_price,
                min_stake=min_stake,
                k=k or cfg.k,
                topq=cfg.topq,
                samples_floor=cfg.samples,
                max_price=max_price,
            )
            max_price, fee, fee_intervals = quote["max_price"], quote["fee"], quote["fee_intervals"]
        extra = {} if fee is None else {"fee": fee, "fee_intervals": fee_intervals}
        req = _client(m, keyfile).request(
            "order",
            job_id=job.job_id.hex(),
            max_price=max_price,
            min_stake=min_stake,
            deadline=m.now() + deadline,
            policy=policy,
            tags=_tags(tag),
            **extra,
            **cluster,
        )
        out = m.execute(req)
    return out if quote is None else {**out, "estimate": quote}


@market.command(short_help="Place a bid (locks the stake)")
@KEY
@click.option(
    "--price",
    type=click.IntRange(1),
    required=True,
    help="Price per job, paid to the worker on release (matches orders whose --max-price is "
    "at least this).",
)
@click.option(
    "--capacity",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Jobs this bid can be matched to (the stake is locked for each).",
)
@click.option("--stake", type=click.IntRange(0), default=0, show_default=True, help="Per job.")
@click.option("--tag", "tag", multiple=True, help="Offer KEY=VALUE (repeatable).")
@_common
def bid(
    db: str,
    now: int | None,
    keyfile: str,
    price: int,
    capacity: int,
    stake: int,
    tag: tuple[str, ...],
) -> dict[str, Any]:
    """Offer CAPACITY jobs at PRICE, staking STAKE per job."""
    return _signed(
        db, keyfile, "bid", now, price=price, capacity=capacity, stake=stake, tags=_tags(tag)
    )


@market.command(short_help="Match an order with the best bid")
@KEY
@click.argument("order_id")
@_common
def match(db: str, now: int | None, keyfile: str, order_id: str) -> dict[str, Any]:
    """Match your ORDER_ID with the best eligible bid."""
    return _signed(db, keyfile, "match", now, order_id=order_id)


@market.command(short_help="Show an order (and why bids did not match) or the book")
@click.argument("order_id", required=False)
@_common
def show(db: str, now: int | None, order_id: str | None) -> dict[str, Any]:
    """Show ORDER_ID with the reason each bid did not match, or the whole book."""
    with _open(db, now) as m:
        return m.show(order_id) if order_id else m.book()


@market.command(short_help="Why an order's challenge policy samples what it does")
@click.argument("order_id")
@click.option(
    "--intervals",
    type=click.IntRange(1, 99_999),
    default=None,
    help="The job's intervals m, 1 to 99 999 (default: those the market's verification recorded).",
)
@_common
def explain(db: str, now: int | None, order_id: str, intervals: int | None) -> Any:
    """Show ORDER_ID's samples and, for skips of 1 % … 100 % of the work, the detection
    probability, the compute a cheater saves and its expected loss (SPEC Part V §10)."""
    with _open(db, now) as m:
        return _Explained(m.explain(order_id, intervals=intervals))


class _Explained(dict):  # type: ignore[type-arg]
    """explain's result: JSON as is, or rendered as a table."""

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(
            title=(
                f"{self['order_id']} ({self['state']}): m = {self['m']} intervals, price "
                f"{self['price']}, stake {self['stake']}, gamma {self['gamma']:g}; samples "
                f"{self['samples']} ({self['source']}; the rule gives {self['economic_samples']})"
            ),
            title_justify="left",
        )
        for col in ("skipped", "of the work", "detected", "compute saved", "expected loss"):
            table.add_column(col, justify="right")
        for r in self["rows"]:
            table.add_row(
                str(r["skipped"]),
                f"{r['fraction']:.0%}",
                f"{r['detect']:.3f}",
                f"{r['expected_gain']:.2f}",
                f"{r['expected_loss']:.2f}",
            )
        if "tolerance" not in self:  # a server of an older version
            return table
        from rich.console import Group

        return Group(table, *self._roles())

    def _roles(self) -> list[Any]:
        """The tolerance profiles, the escrow and the whistles (SPEC V §11-§13)."""
        from rich.table import Table

        tol, esc = self["tolerance"], self["escrow"]
        fixed = tol["fixed"]
        head = (
            f"tolerance: {fixed:g} (median of the profiles, fixed at the match)"
            if fixed is not None
            else "tolerance: the job's own pol.tolerance"
            if not tol["profiles_needed"]
            else f"tolerance: not fixed yet; {tol['profiles_needed']} profiles needed, "
            f"median now {tol['median']}"
        )
        prof = Table(title=f"{head}\n{tol['rule']}", title_justify="left")
        for col in ("profile", "validator", "distance", "tolerance", "deposit", "state"):
            prof.add_column(col)
        for p in tol["profiles"]:
            prof.add_row(
                p["profile_id"],
                p["validator"][:16],
                f"{p['distance']:g}",
                f"{p['tolerance']:g}",
                str(p["deposit"]),
                p["state"],
            )
        due = "after verification" if esc["fee_due"] is None else str(esc["fee_due"])
        escrow = Table(title="escrow (SPEC V §11)", title_justify="left")
        escrow.add_column("item")
        escrow.add_column("amount", justify="right")
        for item, value in (
            ("locked at order (max_price + fee)", esc["locked_at_order"]),
            ("held now", esc["held_now"]),
            ("matched price", esc["price"]),
            (f"fee for {esc['fee_intervals']} challenged intervals", esc["fee"]),
            (f"fee due ({esc['challenged']} challenged)", due),
            ("fee refunded at release", esc["refund_at_settlement"]),
        ):
            escrow.add_row(item, "-" if value is None else str(value))
        whistles = Table(
            title=f"whistles (a true one pays at least {self['whistle_payout']}; "
            f"treasury {self['treasury']})",
            title_justify="left",
        )
        for col in ("whistle", "whistler", "interval", "deposit", "state"):
            whistles.add_column(col)
        for w in self["whistles"]:
            whistles.add_row(
                w["whistle_id"],
                w["whistler"][:16],
                str(w["interval"]),
                str(w["deposit"]),
                w["state"],
            )
        return [prof, escrow, whistles]


@market.command(short_help="Free balance of an account")
@click.option(
    "--key",
    "keyfile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The account's Ed25519 secret key file (or give --account).",
)
@click.option(
    "--account", default=None, callback=worker_hex, help="Public key (64 hex) instead of --key."
)
@_common
def balance(db: str, now: int | None, keyfile: str | None, account: str | None) -> dict[str, Any]:
    """Show the free balance of --account (or of the --key's account)."""
    if (keyfile is None) == (account is None):
        raise click.UsageError("give exactly one of --key and --account")
    if account is None:
        from dk.crypto.keys import load_signing_key

        account = load_signing_key(cast(str, keyfile)).verify_key.hex()  # given: checked above
    with _open(db, now) as m:
        return {"account": account, "balance": m.balance(account)}


@market.command(short_help="Cancel your open order or bid (returns escrow or stake)")
@KEY
@click.argument("id_")
@_common
def cancel(db: str, now: int | None, keyfile: str, id_: str) -> dict[str, Any]:
    """Cancel ID_: an order (o…) or a bid (b…) of yours that is still open."""
    if id_.startswith("o"):
        return _signed(db, keyfile, "cancel_order", now, order_id=id_)
    if id_.startswith("b"):
        return _signed(db, keyfile, "cancel_bid", now, bid_id=id_)
    raise click.UsageError(f"{id_!r} is neither an order id (o…) nor a bid id (b…)")


@market.command(short_help="Commit to a bundle for a matched order")
@KEY
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@_common
def submit(db: str, now: int | None, keyfile: str, order_id: str, bundle: str) -> dict[str, Any]:
    """Submit BUNDLE's commitment for ORDER_ID (to a market server: BUNDLE is uploaded first,
    as the server holds every bundle it is committed to, SPEC V §5.1)."""
    with _open(db, now) as m:
        client = _client(m, keyfile)
        params = m.deliver(order_id, client.account, bundle)
        return m.execute(client.request("submit", **params))


@market.command("verify", short_help="Run the market's verification of a result")
@click.argument("order_id")
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The order's job.toml (refused with JOB_MISMATCH if it is another job).",
)
@_common
def verify_cmd(
    db: str, now: int | None, order_id: str, bundle: str | None, job_path: str
) -> dict[str, Any]:
    """Verify ORDER_ID's committed bundle with the order's beacon (fixed by its drawn
    validators). A market server verifies the copy it holds since the submit (anyone may ask,
    without BUNDLE: SPEC V §5.1); a local ledger needs BUNDLE.

    reject refunds the consumer and slashes the worker; inconclusive moves nothing.
    """
    with _open(db, now) as m:
        return m.verify_result(order_id, bundle, _job(job_path))


@market.command("bls-keygen", short_help="Create a validator BLS key")
@click.argument("path", type=click.Path(dir_okay=False))
@_common
def bls_keygen(db: str, now: int | None, path: str) -> dict[str, Any]:
    """Write a new BLS secret key to PATH (mode 0600)."""
    from dk.market import BlsKey

    key = BlsKey.generate()
    key.save(path)
    return {"path": path, "bls_pk": key.pk.hex()}


@market.command("register-validator", short_help="Register as a validator (locks a stake)")
@KEY
@click.option(
    "--bls-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Your BLS secret key file (dk market bls-keygen), registered with its proof of "
    "possession.",
)
@click.option(
    "--stake", type=click.IntRange(1), default=None, help="Default: the market's minimum."
)
@_common
def register_validator(
    db: str, now: int | None, keyfile: str, bls_key: str, stake: int | None
) -> dict[str, Any]:
    """Register the key's account with a BLS key, its proof of possession and a stake."""
    from dk.market import BlsKey
    from dk.market.validator import registration_request

    with _open(db, now) as m:
        amount = m.config.min_validator_stake if stake is None else stake
        return m.execute(registration_request(_client(m, keyfile), BlsKey.load(bls_key), amount))


@market.command("unregister-validator", short_help="Retire as a validator (returns the stake)")
@KEY
@_common
def unregister_validator(db: str, now: int | None, keyfile: str) -> dict[str, Any]:
    """Retire the key's account; refused while it is drawn for an unsettled order."""
    return _signed(db, keyfile, "unregister_validator", now)


@market.command(short_help="Post your beacon share for an order you were drawn for")
@KEY
@click.option(
    "--bls-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The BLS secret key file registered for your validator account.",
)
@click.argument("order_id")
@_common
def share(db: str, now: int | None, keyfile: str, bls_key: str, order_id: str) -> dict[str, Any]:
    """Sign ORDER_ID's recorded commitment with your registered BLS key."""
    from dk.market import BlsKey
    from dk.market.validator import share_request

    with _open(db, now) as m:
        return m.execute(share_request(m, _client(m, keyfile), BlsKey.load(bls_key), order_id))


@market.command(short_help="Replace drawn validators that withheld their share")
@click.argument("order_id")
@_common
def redraw(db: str, now: int | None, order_id: str) -> dict[str, Any]:
    """After the share deadline: penalise the withholders of ORDER_ID and draw replacements."""
    with _open(db, now) as m:
        return m.redraw(order_id)


@market.command(short_help="Verify a result yourself and attest it")
@KEY
@click.option(
    "--bls-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The BLS secret key file registered for your validator account.",
)
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The order's job.toml, to verify BUNDLE against.",
)
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@_common
def attest(
    db: str,
    now: int | None,
    keyfile: str,
    bls_key: str,
    job_path: str,
    order_id: str,
    bundle: str,
) -> dict[str, Any]:
    """Re-run the verifier on BUNDLE and sign an attestation for ORDER_ID (accept only)."""
    from dk.market import BlsKey
    from dk.market.validator import attestation_request

    with _open(db, now) as m:
        client = _client(m, keyfile)
        req = attestation_request(m, client, BlsKey.load(bls_key), order_id, bundle, _job(job_path))
        return m.execute(req)


@market.command(short_help="Post your tolerance profile of an order (validators)")
@KEY
@click.argument("order_id")
@click.option(
    "--calibration",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The JSON of a `dk calibrate --json` run on this job.",
)
@click.option(
    "--job",
    "job_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Run `dk calibrate` on this job now (the order's job) and post what it measures.",
)
@click.option(
    "--intervals",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="With --job: first intervals to train and replay (as `dk calibrate --intervals`).",
)
@_common
def profile(
    db: str,
    now: int | None,
    keyfile: str,
    order_id: str,
    calibration: str | None,
    job_path: str | None,
    intervals: int,
) -> dict[str, Any]:
    """Post the honest replay distance and the tolerance you measured for ORDER_ID's job
    (locks the market's profile deposit; SPEC V §12)."""

    from dk.market.validator import measure_profile, order_profile_request

    if (calibration is None) == (job_path is None):
        raise click.UsageError("give exactly one of --calibration and --job")
    if calibration is not None:
        import json

        with open(calibration, "rb") as f:
            raw = f.read(1 << 20)
        try:  # `dk calibrate --json` writes Infinity for a cheat that never converges
            cal = json.loads(raw)
        except ValueError as e:
            from dk.errors import FormatError

            raise FormatError(f"{calibration} is not JSON: {e}") from None
        if not isinstance(cal, dict):
            raise click.BadParameter("not a JSON object", param_hint="--calibration")
    else:
        cal = measure_profile(_job(cast(str, job_path)), intervals=intervals)
    with _open(db, now) as m:
        return m.execute(order_profile_request(m, _client(m, keyfile), order_id, cal))


@market.command(short_help="Re-run an order's attested verification with its beacon")
@click.argument("order_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The order's job.toml, to verify BUNDLE against.",
)
@_common
def recheck(db: str, now: int | None, order_id: str, bundle: str, job_path: str) -> Any:
    """Verify BUNDLE as ORDER_ID's validators did (recorded beacon, policy, tolerance) and
    list the challenged intervals that fail: what a whistleblower checks (SPEC V §13)."""
    from dk.market.whistle import recheck as run

    with _open(db, now) as m:
        return run(m, order_id, bundle, _job(job_path))


@market.command(short_help="Whistle on an accepted order's attestations (posts a deposit)")
@KEY
@click.argument("order_id")
@click.option(
    "--deposit",
    type=click.IntRange(1),
    required=True,
    help="Deposit to post: returned if the whistle is true, forfeited to the treasury if false.",
)
@click.option("--interval", type=click.IntRange(0), default=None, help="A challenged interval.")
@click.option(
    "--bundle",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Re-check this (the committed) bundle and whistle on the first failing interval.",
)
@click.option(
    "--job",
    "job_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="With --bundle: the order's job.toml, to re-check the bundle against.",
)
@_common
def whistle(
    db: str,
    now: int | None,
    keyfile: str,
    order_id: str,
    deposit: int,
    interval: int | None,
    bundle: str | None,
    job_path: str | None,
) -> dict[str, Any]:
    """Dispute ORDER_ID's attestations: a true whistle slashes the attesters to you (topped up
    by the treasury), a false one forfeits the deposit to the treasury (SPEC V §13)."""
    from dk.market.whistle import whistle_request

    if (interval is None) == (bundle is None) or (bundle is None) != (job_path is None):
        raise click.UsageError("give --interval, or --bundle with --job")
    with _open(db, now) as m:
        req = whistle_request(
            m,
            _client(m, keyfile),
            order_id,
            deposit,
            interval=interval,
            bundle_dir=bundle,
            job=None if job_path is None else _job(job_path),
        )
        return m.execute(req)


@market.command("resolve-whistle", short_help="Decide a whistle by replay")
@click.argument("whistle_id")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The order's job.toml (refused with JOB_MISMATCH if it is another job).",
)
@_common
def resolve_whistle(
    db: str, now: int | None, whistle_id: str, bundle: str, job_path: str
) -> dict[str, Any]:
    """Replay the interval WHISTLE_ID names; an inconclusive replay leaves it open."""
    with _open(db, now) as m:
        return m.resolve_whistle(whistle_id, bundle, _job(job_path))


@market.command(short_help="The treasury's inflows, outflows and balance")
@_common
def treasury(db: str, now: int | None) -> dict[str, Any]:
    """Show what entered the jackpot treasury (penalties, forfeits) and what left it."""
    with _open(db, now) as m:
        return m.treasury()


@market.command(short_help="Accept a verified result with k attestations")
@click.argument("order_id")
@_common
def accept(db: str, now: int | None, order_id: str) -> dict[str, Any]:
    """Aggregate the drawn validators' attestations of ORDER_ID and open its window."""
    with _open(db, now) as m:
        return m.accept(order_id)


@market.command(short_help="Challenge an accepted result (posts a bond)")
@KEY
@click.argument("order_id")
@click.option(
    "--bond",
    type=click.IntRange(1),
    required=True,
    help="Bond to post: returned if the challenge is upheld, paid to the worker if it fails.",
)
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
    now: int | None,
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
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The order's job.toml (refused with JOB_MISMATCH if it is another job).",
)
@_common
def resolve(
    db: str, now: int | None, challenge_id: str, bundle: str, job_path: str
) -> dict[str, Any]:
    """Replay the interval CHALLENGE_ID disputes; an inconclusive replay leaves it open."""
    with _open(db, now) as m:
        return m.resolve_challenge(challenge_id, bundle, _job(job_path))


@market.command(short_help="Release or refund an order")
@click.argument("order_id")
@_common
def settle(db: str, now: int | None, order_id: str) -> dict[str, Any]:
    """Release ORDER_ID to the worker after its window, or refund it on expiry/timeout."""
    with _open(db, now) as m:
        return m.settle(order_id)


@market.command(short_help="Re-check the chain, signatures and conservation")
@click.option("--no-bls", is_flag=True, help="Skip the (slow) BLS re-checks.")
@_common
def audit(db: str, now: int | None, no_bls: bool) -> dict[str, Any]:
    """Audit the whole ledger; exit 1 if anything is wrong."""
    with _open(db, now) as m:
        report = m.audit(check_bls=not no_bls)
    if not report.ok:
        from dk.market import MarketRefused

        raise MarketRefused("AUDIT_FAILED", "; ".join(report.problems[:5]))
    return report.to_dict()


@market.command(short_help="Serve the ledger over HTTP (the market as a service)")
@click.option(
    "--db",
    envvar="DK_MARKET_DB",
    default="market.db",
    show_default=True,
    help="Ledger file (SQLite) or postgresql://… URL.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="TCP port to listen on (0 picks a free one).",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where uploaded jobs and bundles are kept (default: <db>.d).",
)
@click.pass_obj
def serve(app: App, db: str, host: str, port: int, state_dir: str | None) -> None:
    """Run `dk market serve`: the ledger behind an HTTP/JSON API that owns the clock.

    Parties use every other `dk market` command with --url (or DK_MARKET_URL).
    """
    from dk.market import MarketRefused
    from dk.market.server import serve as run_server

    try:
        run_server(
            db,
            host=host,
            port=port,
            state_dir=state_dir,
            ready=lambda p: app.info(f"dk market serve: listening on http://{host}:{p}"),
        )
    except MarketRefused as e:
        app.abort(str(e), ExitCode.REJECTED)
