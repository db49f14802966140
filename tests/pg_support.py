"""A throwaway PostgreSQL 15 server for tests (never a mock).

PostgreSQL refuses to run as root, and CI runs as root, so the cluster is created and started
as the ``postgres`` user (``runuser``) in a directory that user owns, listening on 127.0.0.1
only, with ``trust`` authentication for local connections. Tests that need it are skipped
where the binaries are missing (the Makefile's test set-up installs Debian's ``postgresql``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(d, "pg_ctl")):
            return Path(d)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def _as_postgres(args: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One throwaway cluster: ``start()``, ``stop(mode)``, ``url``; ``close()`` deletes it."""

    def __init__(self) -> None:
        bindir = pg_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl) not found")
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="dk-pg-"))
        self.data = self.base / "data"
        os.chmod(self.base, 0o777)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run(
            _as_postgres(
                [str(bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
            ),
            check=True,
            capture_output=True,
        )

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        # fsync off: the tests kill processes, never the OS, so nothing depends on the disk
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} -c fsync=off"
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts]
        subprocess.run(
            _as_postgres([*cmd, "-l", str(self.base / "log"), *args]),
            check=check,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg_ctl("-w", "start")
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no checkpoint, clients cut off)."""
        self._pg_ctl("-m", mode, "stop", check=False)

    def close(self) -> None:
        """Stop the server and delete its files."""
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[PgServer]:
    """A started throwaway cluster, stopped and deleted afterwards."""
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


def fresh_database(url: str, name: str) -> str:
    """Create database ``name`` on the server of ``url``; return its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}"')
        con.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
