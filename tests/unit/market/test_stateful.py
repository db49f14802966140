"""Random market operations keep conservation, never release twice, never go negative."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from market_support import T0, Clock, FakeJob, key, make_bundle, market_config, new_market

from dk.errors import FormatError
from dk.market import Client, MarketRefused, bundle_commitment
from dk.market.attest import attestation_message
from dk.market.beacon import members, order_share_message

USERS = 4
VALIDATORS = 4
who = st.integers(0, USERS - 1)
money = st.integers(1, 300)
JOB = FakeJob(bytes(range(32)))


class MarketMachine(RuleBasedStateMachine):
    """Drives a market with random signed requests and market-side steps."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="dk-market-"))
        self.clock = Clock()
        # a payout above what two attesters and a small stake bring: the treasury tops it up
        self.m = new_market(
            self.dir / "m.db", clock=self.clock, config=market_config(whistle_payout=500)
        )
        self.clients = [Client(key(i + 1), self.m.market_id) for i in range(USERS)]
        # validators are accounts of their own: USERS + j, BLS secret 500 + j
        self.clients += [Client(key(20 + j), self.m.market_id) for j in range(VALIDATORS)]
        self.now = T0
        self.net = 0  # deposits - withdrawals, as the model sees them
        self.orders: list[str] = []
        self.challenges: list[str] = []
        self.whistles: list[str] = []
        self.validators: list[int] = []
        self.settled: dict[str, int] = {}
        for i in range(USERS):
            self.deposit(i, 500)
        for j in range(VALIDATORS):
            self.deposit(USERS + j, 300)
            self.register(j)

    def teardown(self) -> None:
        self.m.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def do(self, i: int, action: str, **params: object) -> dict | None:
        try:
            self.clock.t = self.now
            return self.m.execute(self.clients[i].request(action, **params))
        except (MarketRefused, FormatError):
            return None

    def system(self, fn, *args, **kw) -> dict | None:
        try:
            self.clock.t = self.now
            return fn(*args, **kw)
        except (MarketRefused, FormatError):
            return None

    def note_outcome(self, out: dict | None) -> None:
        if out and "outcome" in out:
            self.settled[out["order_id"]] = self.settled.get(out["order_id"], 0) + 1

    @rule(i=who, amount=money)
    def deposit(self, i: int, amount: int) -> None:
        if self.do(i, "deposit", amount=amount):
            self.net += amount

    @rule(i=who, amount=money)
    def withdraw(self, i: int, amount: int) -> None:
        if self.do(i, "withdraw", amount=amount):
            self.net -= amount

    @rule(i=who, j=who, amount=money)
    def transfer(self, i: int, j: int, amount: int) -> None:
        self.do(i, "transfer", to=self.clients[j].account, amount=amount)

    @rule(
        i=who,
        price=money,
        stake=st.integers(0, 50),
        span=st.integers(1, 200),
        fee=st.integers(0, 40),
        profiled=st.booleans(),
    )
    def order(
        self, i: int, price: int, stake: int, span: int, fee: int = 0, profiled: bool = False
    ) -> None:
        extra: dict[str, object] = {"fee": fee, "fee_intervals": 1 + fee % 5} if fee else {}
        out = self.do(
            i,
            "order",
            job_id=JOB.job_id.hex(),
            max_price=price,
            min_stake=stake,
            deadline=self.now + span,
            policy={"profiles": 3} if profiled else {},
            **extra,
        )
        if out:
            self.orders.append(out["order_id"])

    @rule(i=who, price=money, stake=st.integers(0, 50), cap=st.integers(1, 3))
    def bid(self, i: int, price: int, stake: int, cap: int) -> None:
        self.do(i, "bid", price=price, capacity=cap, stake=stake)

    @rule(i=who, j=who, price=money, stake=st.integers(0, 50), span=st.integers(1, 200))
    def order_bid_match(self, i: int, j: int, price: int, stake: int, span: int) -> None:
        self.order(i, price, stake, span)
        self.bid(j, price, stake, 1)
        if self.orders:
            self.do(i, "match", order_id=self.orders[-1])

    @rule(i=who, j=who, price=money, forged=st.booleans(), bad=st.booleans())
    def whole_job(self, i: int, j: int, price: int, forged: bool, bad: bool) -> None:
        self.order_bid_match(i, j, price, 10, 300)
        if self.orders:
            self.deliver(len(self.orders) - 1, forged, bad)
            self.attest_and_accept(len(self.orders) - 1)

    @rule(
        i=who,
        j=who,
        price=money,
        fee=st.integers(0, 40),
        tolerances=st.lists(st.sampled_from([1e-4, 1e-2, 0.012, 1.0]), min_size=3, max_size=4),
        bad=st.booleans(),
        whistler=who,
        interval=st.sampled_from([1, 1, 0, 3]),
    )
    def whole_job_with_roles(
        self,
        i: int,
        j: int,
        price: int,
        fee: int,
        tolerances: list[float],
        bad: bool,
        whistler: int,
        interval: int,
    ) -> None:
        """Profiles, a fee, a delivery (bad interval 1 missed by the attesters), a whistle."""
        self.order(i, price, 10, 300, fee, profiled=True)
        if not self.orders:
            return
        n = len(self.orders) - 1
        for v, t in enumerate(tolerances):
            self.profile(v, n, t)
        self.bid(j, price, 10, 1)
        self.do(i, "match", order_id=self.orders[n])
        self.deliver(n, False, bad)
        self.attest_and_accept(n)
        self.whistle(whistler, n, 10 + fee, interval)
        if self.whistles:
            self.resolve_whistle(len(self.whistles) - 1)
        self.now += 150  # past the window: release pays the fee due
        self.settle(n)

    @precondition(lambda self: self.orders)
    @rule(i=who, n=st.integers(0, 100))
    def match(self, i: int, n: int) -> None:
        oid = self.orders[n % len(self.orders)]
        self.do(i, "match", order_id=oid)  # usually NOT_OWNER: only the consumer may match
        consumer = self.m.order(oid)["consumer"]
        owner = next(c for c in range(USERS) if self.clients[c].account == consumer)
        self.do(owner, "match", order_id=oid)

    @precondition(lambda self: self.orders)
    @rule(i=who, n=st.integers(0, 100))
    def cancel(self, i: int, n: int) -> None:
        self.note_outcome(self.do(i, "cancel_order", order_id=self.orders[n % len(self.orders)]))

    def vidx(self, account: str) -> int:
        return next(j for j in range(VALIDATORS) if self.clients[USERS + j].account == account)

    @rule(j=st.integers(0, VALIDATORS - 1))
    def register(self, j: int) -> None:
        sk = 500 + j
        self.do(
            USERS + j,
            "register_validator",
            bls_pk=self.m.bls.sk_to_pk(sk).hex(),
            pop=self.m.bls.pop_prove(sk).hex(),
            stake=100,
        )

    @rule(j=st.integers(0, VALIDATORS - 1))
    def unregister(self, j: int) -> None:
        self.do(USERS + j, "unregister_validator")  # VALIDATOR_BUSY while drawn

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100), withhold=st.booleans())
    def share(self, n: int, withhold: bool) -> None:
        order = self.m.order(self.orders[n % len(self.orders)])
        if order["state"] != "submitted":
            return
        msg = order_share_message(self.m.market_id, order)
        drawn = members(order)
        for v in drawn[1:] if withhold else drawn:
            j = self.vidx(v)
            self.do(
                USERS + j,
                "beacon_share",
                order_id=order["order_id"],
                signature=self.m.bls.sign(500 + j, msg).hex(),
            )

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100))
    def redraw(self, n: int) -> None:
        self.system(self.m.redraw, self.orders[n % len(self.orders)])

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100))
    def verify(self, n: int) -> None:
        oid = self.orders[n % len(self.orders)]
        self.note_outcome(self.system(self.m.verify_result, oid, self.dir / f"b-{oid}", JOB))

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100), forged=st.booleans(), bad=st.booleans(), unsure=st.booleans())
    def deliver(self, n: int, forged: bool, bad: bool, unsure: bool = False) -> None:
        oid = self.orders[n % len(self.orders)]
        order = self.m.order(oid)
        if order["state"] != "matched":
            return
        worker = next(c for c in range(USERS) if self.clients[c].account == order["worker"])
        bundle = make_bundle(
            self.dir / f"b-{oid}",
            JOB.job_id,
            order["worker"],
            forged=forged,
            bad_intervals=[1] if bad else [],
            inconclusive=unsure,
            replay_inconclusive=unsure,
        )
        if self.do(worker, "submit", order_id=oid, **bundle_commitment(bundle)):
            self.share(self.orders.index(oid), False)
            self.note_outcome(self.system(self.m.verify_result, oid, bundle, JOB))

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100))
    def attest_and_accept(self, n: int) -> None:
        oid = self.orders[n % len(self.orders)]
        order = self.m.order(oid)
        if order["state"] != "verified":
            return
        msg = attestation_message(self.m.market_id, oid, bytes.fromhex(order["report_digest"]))
        for v in members(order)[:2]:
            j = self.vidx(v)
            self.do(
                USERS + j,
                "attest",
                order_id=oid,
                report_digest=order["report_digest"],
                signature=self.m.bls.sign(500 + j, msg).hex(),
            )
        self.system(self.m.accept, oid)

    @precondition(lambda self: self.orders)
    @rule(i=who, n=st.integers(0, 100), bond=money, interval=st.integers(0, 4))
    def challenge(self, i: int, n: int, bond: int, interval: int) -> None:
        out = self.do(
            i, "challenge", order_id=self.orders[n % len(self.orders)], bond=bond, interval=interval
        )
        if out:
            self.challenges.append(out["challenge_id"])

    @precondition(lambda self: self.challenges)
    @rule(n=st.integers(0, 100))
    def resolve(self, n: int) -> None:
        cid = self.challenges[n % len(self.challenges)]
        oid = self.m.ledger.con.execute(
            "SELECT order_id FROM challenges WHERE challenge_id = ?", (cid,)
        ).fetchone()[0]
        self.note_outcome(self.system(self.m.resolve_challenge, cid, self.dir / f"b-{oid}", JOB))

    @precondition(lambda self: self.orders)
    @rule(n=st.integers(0, 100))
    def settle(self, n: int) -> None:
        self.note_outcome(self.system(self.m.settle, self.orders[n % len(self.orders)]))

    @precondition(lambda self: self.orders)
    @rule(
        j=st.integers(0, VALIDATORS - 1),
        n=st.integers(0, 100),
        tolerance=st.sampled_from([1e-4, 1e-2, 0.012, 0.02, 1.0]),
    )
    def profile(self, j: int, n: int, tolerance: float) -> None:
        self.do(
            USERS + j,
            "profile",
            order_id=self.orders[n % len(self.orders)],
            job_id=JOB.job_id.hex(),
            distance=tolerance / 10,
            tolerance=tolerance,
        )

    @precondition(lambda self: self.orders)
    @rule(i=who, n=st.integers(0, 100), deposit=money, interval=st.integers(0, 3))
    def whistle(self, i: int, n: int, deposit: int, interval: int) -> None:
        out = self.do(
            i,
            "whistle",
            order_id=self.orders[n % len(self.orders)],
            deposit=deposit,
            interval=interval,
        )  # true when the delivery had a bad interval 1 and the interval is 1
        if out:
            self.whistles.append(out["whistle_id"])

    @precondition(lambda self: self.whistles)
    @rule(n=st.integers(0, 100))
    def resolve_whistle(self, n: int) -> None:
        wid = self.whistles[n % len(self.whistles)]
        oid = self.m.ledger.con.execute(
            "SELECT order_id FROM whistles WHERE whistle_id = ?", (wid,)
        ).fetchone()[0]
        self.note_outcome(self.system(self.m.resolve_whistle, wid, self.dir / f"b-{oid}", JOB))

    @rule(dt=st.integers(1, 120))
    def advance(self, dt: int) -> None:
        self.now += dt

    @invariant()
    def conserved_and_never_negative(self) -> None:
        report = self.m.audit()
        assert report.ok, report.problems
        assert report.totals["held"] == self.net
        book = self.m.treasury()
        assert book["conserved"] and book["balance"] == book["held"] == report.totals["treasury"]
        low = self.m.ledger.con.execute(
            "SELECT MIN(amount) FROM holdings WHERE holder != 'world'"
        ).fetchone()[0]
        assert low is None or low >= 0
        assert all(count == 1 for count in self.settled.values())
        for oid in self.settled:
            assert self.m.show(oid)["escrow"] == 0

    @invariant()
    def settled_orders_are_terminal(self) -> None:
        states = dict(self.m.ledger.con.execute("SELECT order_id, state FROM orders"))
        for oid in self.settled:
            assert states[oid] in {
                "released",
                "expired",
                "timed_out",
                "rejected",
                "slashed",
                "cancelled",
            }, (oid, states[oid], json.dumps(self.settled))


MarketMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMarketMachine = MarketMachine.TestCase
