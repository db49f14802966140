"""Every ``dk`` command and every option has help text: ``dk <command> --help`` never shows a
bare ``--job FILE``."""

from __future__ import annotations

from collections.abc import Iterator

import click

from dk.cli.app import cli


def _commands(
    cmd: click.Command, ctx: click.Context, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], click.Command | None]]:
    """``(path, command)`` for ``cmd`` and every command under it; ``None`` where a listed
    sub-command cannot be loaded."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None:
                yield (*path, name), None
            else:
                yield from _commands(
                    sub, click.Context(sub, info_name=name, parent=ctx), (*path, name)
                )


def test_every_command_and_option_has_help() -> None:
    missing = []
    seen = 0
    for path, cmd in _commands(cli, click.Context(cli, info_name="dk"), ("dk",)):
        where = " ".join(path)
        if cmd is None:
            missing.append(f"{where}: listed but cannot be loaded")
            continue
        seen += 1
        if not (cmd.help or "").strip():
            missing.append(f"{where}: no docstring/help")
        for p in cmd.params:
            if (
                isinstance(p, click.Option)
                and "--help" not in p.opts
                and not (p.help or "").strip()
            ):
                missing.append(f"{where} {'/'.join(p.opts)}: no help")
    assert seen > 40, f"walked only {seen} commands"  # the lazy groups were really loaded
    assert not missing, "missing help text:\n" + "\n".join(missing)
