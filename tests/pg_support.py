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


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a fresh cluster; yield a URL to its ``postgres`` database; stop and delete it."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl) not found")
    base = Path(tempfile.mkdtemp(prefix="dk-pg-"))
    data = base / "data"
    os.chmod(base, 0o777)
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    port = _free_port()
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off"
    pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log")]
    subprocess.run(
        _as_postgres([*pg_ctl, "-w", "start"]),
        check=True,
        capture_output=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """Create database ``name`` on the server of ``url``; return its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}"')
        con.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
