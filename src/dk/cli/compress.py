"""``dk compress``: check and benchmark the gradient-compression kernels."""

from __future__ import annotations

import click

from dk.cli.app import App
from dk.cli.exit_codes import ExitCode


@click.group(short_help="Gradient compression kernels")
def compress() -> None:
    """Gradient compression: kernel checks and benchmarks."""


@compress.command(short_help="Check that the fast kernels agree with their references")
@click.option(
    "--size",
    "n",
    type=click.IntRange(1, 50_000_000),
    default=100_003,
    show_default=True,
    help="Float32 elements in each kernel's random test input.",
)
@click.option("--cuda/--no-cuda", default=None, help="Also check CUDA kernels (default: if a GPU).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_obj
def check(app: App, n: int, cuda: bool | None, as_json: bool) -> None:
    """Check that every fast kernel gives the bits of its NumPy reference on this machine."""
    from dk.compress import check_kernels

    results = check_kernels(n=n, cuda=cuda)
    ok = all(r.ok for r in results)
    if as_json:
        app.emit_json({"ok": ok, "kernels": [r.as_dict() for r in results]})
    else:
        for r in results:
            mark = "ok  " if r.ok else "FAIL"
            app.print(f"{mark} {r.kernel:<18} {r.backend:<6} n={r.n} {r.detail}".rstrip())
    if not ok:
        app.abort("kernels disagree with their references", ExitCode.REJECTED)


@compress.command(short_help="Kernel throughput vs NumPy and torch (one thread)")
@click.option(
    "--size",
    "n",
    type=click.IntRange(1024, 200_000_000),
    default=10_000_000,
    show_default=True,
    help="Float32 elements.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="Timed runs per kernel (the fastest counts).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@click.pass_obj
def bench(app: App, n: int, repeats: int, as_json: bool) -> None:
    """Measure GB/s of each kernel next to its NumPy reference and the torch equivalent."""
    from dk.compress import bench_kernels

    rows = bench_kernels(n=n, repeats=repeats)
    if as_json:
        app.emit_json({"n": n, "threads": 1, "rows": [r.as_dict() for r in rows]})
        return
    from rich.table import Table

    table = Table(title=f"dk.compress kernels, {n} float32, 1 thread (GB/s of input)")
    for col in ("kernel", "numba", "numpy", "torch", "numba/torch"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for r in rows:
        vs = f"{r.vs_torch:.1f}x" if r.vs_torch else "-"
        torch_gbps = f"{r.torch:.2f}" if r.torch else "-"
        table.add_row(r.kernel, f"{r.numba:.2f}", f"{r.numpy:.2f}", torch_gbps, vs)
    app.print(table)
