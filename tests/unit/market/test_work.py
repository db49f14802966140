"""Work estimates from the job's own model graph (SPEC V §11)."""

from __future__ import annotations

from dk.market.work import estimate_work, step_flops
from dk.pol.jobinit import default_job


def test_step_flops_follow_the_model_graph() -> None:
    small = step_flops(default_job(hidden=[64], batch_size=32))
    assert small == step_flops(default_job(hidden=[64], batch_size=32))  # deterministic
    # the matmul FLOPs (forward 2·b·(64·h + h·10), backward twice that) dominate
    wide = step_flops(default_job(hidden=[256], batch_size=32))
    assert 3.5 < wide / small < 4.5
    assert step_flops(default_job(hidden=[64], batch_size=64)) > 1.8 * small
    b = 32
    forward = 2 * b * (64 * 64 + 64 * 10)
    backward = 2 * (2 * b * 64 * 10) + 2 * b * 64 * 64  # no gradient for the input batch
    update = 4 * (64 * 64 + 64 + 64 * 10 + 10)  # SGD with momentum, per parameter
    assert small == forward + backward + update


def test_estimate_scales_with_steps_and_samples() -> None:
    j = default_job(steps=200, interval=10)
    e = estimate_work(j, samples=5, flops_per_step=1_000_000)
    assert (e.steps, e.train_flops) == (200, 200_000_000)
    assert e.verify_flops == 1_000_000 * 5 * 10
    assert e.fee == max(1, round((e.train_flops + e.verify_flops) / 1e9))
    assert estimate_work(j, samples=5, flops_per_step=10**9, gflop_price=3).fee == 3 * 250
    assert estimate_work(j, samples=999, flops_per_step=1).verify_flops == 200  # all intervals


def test_order_quote_locks_the_largest_challenge_and_prices_the_training() -> None:
    from dk.market.work import challenged_bound, order_quote

    j = default_job(steps=200, interval=10)  # m = 20 intervals
    q = order_quote(
        j,
        gflop_price=2.0,
        min_stake=0,
        k=2,
        topq=1,
        samples_floor=2,
        samples=5,
        flops_per_step=10**8,
        epochs=3,
    )
    assert q["max_price"] == 40  # 200 steps x 0.1 GFLOP x 2
    assert q["fee_intervals"] == 5 + 1 * 3
    assert q["verify_flops"] == 2 * 8 * 10 * 10**8 and q["fee"] == 32
    assert challenged_bound(20, 50, 1, 3) == 20  # never more than every interval
    # no samples given: the economic default at max_price and min_stake bounds the fixed one
    q2 = order_quote(
        j,
        gflop_price=2.0,
        min_stake=40,
        k=2,
        topq=0,
        samples_floor=2,
        max_price=40,
        flops_per_step=10**8,
        epochs=1,
    )
    from dk.market.economics import order_samples

    assert q2["samples_bound"] == order_samples(20, 40, 40, 2) == q2["fee_intervals"]
    assert order_samples(20, 30, 60, 2) <= q2["samples_bound"]  # a cheaper match, more stake
