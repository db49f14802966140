"""The ``dk`` command: a thin click + rich layer over the library.

Each command parses its options, makes one library call, renders the result and exits with a
code from :mod:`dk.cli.exit_codes`. Results go to stdout (``--json`` for machines), messages to
stderr. Expected errors print one line; a bug prints a traceback and exits 70.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from rich.console import Console

from dk.cli.exit_codes import ExitCode, exit_code_for


class App:
    """Shared state of one ``dk`` invocation: consoles and rendering helpers."""

    # The consoles (and rich) are made on first use: ``dk CMD --help`` never imports rich.
    @functools.cached_property
    def out(self) -> Console:
        """Console for human output (stdout)."""
        from rich.console import Console

        return Console(highlight=False, soft_wrap=True)

    @functools.cached_property
    def err(self) -> Console:
        """Console for messages (stderr)."""
        from rich.console import Console

        return Console(stderr=True, highlight=False, soft_wrap=True)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print human output to stdout."""
        self.out.print(*args, **kwargs)

    def info(self, message: str) -> None:
        """Print a progress/info message to stderr."""
        self.err.print(message)

    def emit_json(self, value: Any) -> None:
        """Write one JSON document to stdout."""
        click.echo(json.dumps(value, indent=2, sort_keys=True))

    def abort(self, message: str | None = None, code: int = ExitCode.USAGE) -> NoReturn:
        """Print ``message`` on stderr (one line) and exit with ``code``."""
        if message:
            click.echo(f"dk: error: {message}", err=True)
        raise SystemExit(int(code))


pass_app = click.make_pass_decorator(App, ensure=True)

_LAZY_COMMANDS = {
    # name: (module, attribute)
    "keygen": ("dk.cli.commands", "keygen"),
    "job": ("dk.cli.commands", "job"),
    "train": ("dk.cli.commands", "train"),
    "prove": ("dk.cli.commands", "prove"),
    "verify": ("dk.cli.commands", "verify"),
    "verify-many": ("dk.cli.commands", "verify_many_cmd"),
    "challenge": ("dk.cli.commands", "challenge"),
    "calibrate": ("dk.cli.commands", "calibrate"),
    "export": ("dk.cli.commands", "export"),
    "plot": ("dk.cli.plot", "plot"),
    "vectors": ("dk.cli.commands", "vectors"),
    "compress": ("dk.cli.compress", "compress"),
    "market": ("dk.cli.market", "market"),
    "fl": ("dk.cli.fl", "fl"),
}


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and infinities (NaN passes every range
    comparison, so ``--skipped nan`` reached the library; a usage error, exit 2)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


def hex32(ctx: click.Context, param: click.Parameter, value: str | None) -> bytes | None:
    """An option of 32 bytes in hex (any case), through dk's one hex check
    (:func:`dk.crypto.hashing.parse_hex_digest`); a usage error, exit 2, otherwise."""
    if value is None:
        return None
    from dk.crypto.hashing import parse_hex_digest
    from dk.errors import FormatError

    try:
        return parse_hex_digest(value.lower(), what=param.name or "value")
    except FormatError:
        raise click.BadParameter("must be 64 hex characters") from None


def worker_hex(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A public key option (:func:`hex32`) as lowercase hex (a malformed key used to reach the
    verifier and reject a valid bundle)."""
    raw = hex32(ctx, param, value)
    return None if raw is None else raw.hex()


class LazyGroup(click.Group):
    """A group whose sub-commands are imported only when used (keeps ``dk --help`` fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return None
        import importlib

        try:
            module = importlib.import_module(target[0])
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("dk."):
                return None
            raise
        cmd = getattr(module, target[1], None)
        return cmd if isinstance(cmd, click.Command) else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dk-pol", prog_name="dk")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """dk: verifiable ML training.

    A worker trains with a recorded Proof-of-Learning transcript (`dk train`), signs it into a
    bundle (`dk prove`), and anyone holding the job checks it cheaply (`dk verify`).

    Exit codes: 0 ok/accepted, 1 rejected, 2 usage, 3 malformed input, 4 missing optional
    backend, 5 verification inconclusive, 69 a service (market server) unreachable, 70 internal
    error.
    """
    ctx.obj = App()


#: Commands whose process may end without interpreter teardown (see :func:`console_main`).
_QUICK_EXIT = frozenset({"verify"})


def _leave_now(code: int) -> None:
    """End the process at once when nothing is left for the interpreter's teardown to do.

    Teardown frees every module (Numba's and LLVM's hold hundreds of thousands of objects):
    about 0.35 s of CPU after ``dk verify`` has printed its report. It is skipped only when no
    other thread runs (no Ray client, no pool still shutting down) and no child process is
    alive; stdout and stderr are flushed first, and logging handlers closed.
    """
    import threading

    mp = sys.modules.get("multiprocessing")
    if threading.active_count() > 1 or (mp is not None and mp.active_children()):
        return
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # let the normal exit report it
    os._exit(code)


def console_main() -> None:
    """The ``dk`` command (console script and ``python -m dk.cli``): :func:`main`, then, for
    the commands in ``_QUICK_EXIT``, an exit without interpreter teardown."""
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if len(sys.argv) > 1 and sys.argv[1] in _QUICK_EXIT and not isinstance(e.code, str):
            _leave_now(code)
        raise


def main(argv: list[str] | None = None) -> None:
    """Entry point for in-process callers: maps exceptions to exit codes (always raises
    ``SystemExit``)."""
    try:
        cli.main(args=argv, prog_name="dk", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("dk: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(ExitCode.USAGE if isinstance(e, click.UsageError) else e.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("dk: interrupted", err=True)
        sys.exit(130)
    except Exception as e:
        code = exit_code_for(e)  # the library decides (dk.errors)
        debug = os.environ.get("DK_DEBUG") == "1"
        if code != ExitCode.INTERNAL and not debug:
            click.echo(f"dk: error: {e}", err=True)
            sys.exit(code)
        from rich.console import Console as _C

        _C(stderr=True).print_exception(show_locals=debug)
        if code != ExitCode.INTERNAL:  # DK_DEBUG=1: the traceback, then the usual line
            click.echo(f"dk: error: {e}", err=True)
            sys.exit(code)
        click.echo(
            "dk: internal error (a bug in dk); please report it with the trace above", err=True
        )
        sys.exit(ExitCode.INTERNAL)
    sys.exit(0)
