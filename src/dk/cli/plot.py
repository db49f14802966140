"""``dk plot``: loss and update norm per interval of a bundle, challenged intervals marked."""

from __future__ import annotations

import click

from dk.cli.app import App


@click.command(short_help="Plot loss and update norm per interval (HTML or SVG)")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option(
    "-o",
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output file: .html (a self-contained page) or .svg.",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A report saved by `dk verify --json`: marks its challenged intervals and findings.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the written path as JSON.")
@click.pass_obj
def plot(app: App, bundle: str, out: str, report_file: str | None, as_json: bool) -> None:
    """Plot BUNDLE's committed training loss and update norm per interval (SPEC §11.7).

    Exit 3 when the manifest or the report is malformed.
    """
    from dk.verifier.plot import write_plot

    path = write_plot(bundle, out, report=report_file)
    if as_json:
        app.emit_json({"plot": str(path)})
    else:
        app.print(f"plot: {path}")
