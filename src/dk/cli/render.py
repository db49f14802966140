"""Rich rendering of reports for humans (``--json`` bypasses all of this)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table


def report_table(d: dict[str, Any]) -> Table:
    """Checks of a verification report as a table."""
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("check")
    t.add_column("result")
    style = {"pass": "green", "fail": "bold red", "skip": "dim"}
    for name, res in d["checks"].items():
        t.add_row(name, f"[{style.get(res, '')}]{res}[/]")
    return t


def report_summary(d: dict[str, Any]) -> list[str]:
    """Verdict, findings and key figures as lines of rich markup."""
    f = d["figures"]
    lines = []
    if d["verdict"] == "accept":
        lines.append("[bold green]ACCEPT[/]  the bundle replays as committed")
    else:
        if d["verdict"] == "inconclusive":
            lines.append("[bold yellow]INCONCLUSIVE[/]  this verifier could not decide")
        else:
            lines.append("[bold red]REJECT[/]")
        for r in d["findings"]:
            where = f" (interval {r['interval']})" if "interval" in r else ""
            # Messages quote bundle contents (blob names...): never let them be markup.
            lines.append(f"  [red]{escape(r['code'])}[/]{where}: {escape(r['message'])}")
    if "intervals" in f:
        # the detection probability is the challenge's: what a finished replay would have had
        done = "" if d["verdict"] != "inconclusive" else ", had the replay been done"
        lines.append(
            f"  challenged {len(d['challenged'])} of {f['intervals']} intervals "
            f"({f.get('replayed_steps', 0)} steps replayed); detection probability "
            f"{f['detection_probability']:.4f} for a worker skipping {f['skipped_fraction']:.0%}"
            f"{done}"
        )
    if d.get("challenged_root"):
        lines.append(f"  challenged root {d['challenged_root']}")
    if d.get("srs"):
        lines.append(f"  SRS {d['srs']['kind']} sha256 {d['srs']['sha256']}")
    if "verify_wall_s" in f:
        read = f.get("bytes_read", 0) + f.get("rounding_log_bytes_read", 0)  # blobs and logs
        lines.append(f"  {read / 1e6:.1f} MB read, {f['verify_wall_s']:.2f} s")
    for flag in d.get("flags", []):
        lines.append(f"  [yellow]flag: {escape(flag)}[/]")
    return lines
