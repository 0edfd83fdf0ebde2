"""A real PostgreSQL server for the tests and benchmarks that need one (tests/conftest.py's
`postgres_url`, bench/class_soak.py): made with Debian's own initdb in a temporary folder,
listening on a Unix socket there only (no TCP), trusted, and stopped and removed afterwards. As
root (CI), the server runs as the `postgres` user, which initdb requires. No pytest here, so a
benchmark runs without it."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl (on PATH, or Debian's /usr/lib/postgresql/N/bin)."""
    if found := shutil.which("initdb"):
        return Path(found).parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda f: int(Path(f).parent.name), reverse=True)
    return next((Path(f) for f in folders if (Path(f) / "initdb").exists()), None)


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _options(root: Path, port: int | str) -> str:
    """The server's settings: its socket in `root` only (no TCP), and no waiting on the disk."""
    return f"-k {root} -p {port} -c listen_addresses='' -c fsync=off"


def fresh_database(url: str) -> str:
    """A new, empty database on the server behind `url`; returns its URL (tests never share rooms)."""
    import psycopg

    name = "t" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return url.replace("/postgres?", f"/{name}?")


@contextmanager
def postgres_server() -> Iterator[str]:
    """A fresh server; yields its URL (database `postgres`, user `tbt`)."""
    folder = binaries()
    if folder is None:
        raise FileNotFoundError("no PostgreSQL server binaries (initdb): install Debian's `postgresql`")
    root = Path(tempfile.mkdtemp(prefix="tbt-pg-"))
    data, port = root / "data", _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    root.chmod(0o755)
    try:
        subprocess.run(_as_server_user([str(folder / "initdb"), "-D", str(data), "-U", "tbt", "--auth=trust",
                                        "-E", "UTF8", "--no-sync"]), check=True, capture_output=True,
                       timeout=START_TIMEOUT_S)
        subprocess.run(_as_server_user([str(folder / "pg_ctl"), "-D", str(data), "-o", _options(root, port), "-w", "-l",
                                        str(root / "server.log"), "start"]), check=True, capture_output=True,
                       timeout=START_TIMEOUT_S)
        try:
            yield f"postgresql://tbt@/postgres?host={root}&port={port}"
        finally:
            subprocess.run(_as_server_user([str(folder / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                           capture_output=True, timeout=START_TIMEOUT_S)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def restart(url: str) -> None:
    """Stop and start the server behind `url` (its data kept): what a database restart mid-lesson is."""
    folder, root = binaries(), Path(url.split("host=")[1].split("&")[0])
    port = url.split("port=")[1]
    subprocess.run(_as_server_user([str(folder / "pg_ctl"), "-D", str(root / "data"), "-m", "fast", "-w", "-o",
                                    _options(root, port), "-l",
                                    str(root / "server.log"), "restart"]), check=True, capture_output=True,
                   timeout=START_TIMEOUT_S)
