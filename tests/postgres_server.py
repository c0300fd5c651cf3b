"""A PostgreSQL server of the tests' own, for the run history on a server: ``initdb`` into a
temporary folder, listening on 127.0.0.1 at a free port (password logins) and on a unix socket in
that folder (the tests' administrator, no password), started once per test session and removed at
its end. PostgreSQL refuses to run as root: as root it runs as the ``postgres`` user (Debian's
package makes one), else ``nobody``."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER, PASSWORD = "kvh", "kvh-secret"  # the role the history logs in as, over TCP with its password
ADMIN = "postgres"  # the superuser, over the unix socket with no password
NO_SERVER = ("no PostgreSQL server binaries (initdb, pg_ctl) on this machine: install Debian's postgresql "
             "package (.ci/run does) to test the run history on a server")


def server_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                     if Path(p).parent.name.isdigit() else 0)
    for folder in reversed(folders):
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _server_user() -> str | None:
    """Who the server runs as: this user, or an unprivileged one when this is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("PostgreSQL refuses to run as root, and there is no postgres or nobody user to run it as")


class PostgresServer:
    def __init__(self, binaries: Path):
        self.binaries = binaries
        self.user = _server_user()
        # short (a unix socket's path is at most 107 bytes), and in /tmp when the server runs as another
        # user, who could not enter a private $TMPDIR
        self.root = Path(tempfile.mkdtemp(prefix="kvh-pg-", dir="/tmp" if self.user else None))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._databases = 0
        if self.user:
            info = pwd.getpwnam(self.user)
            os.chown(self.root, info.pw_uid, info.pw_gid)

    def _run(self, *argv: str, timeout: float = 60) -> None:
        out = subprocess.run([str(self.binaries / argv[0]), *argv[1:]], user=self.user, cwd=self.root,
                             capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({out.returncode}): {out.stderr.strip()}\n{log}")

    def start(self) -> PostgresServer:
        password_file = self.root / "admin-password"
        password_file.write_text("unused-admin-password\n")
        if self.user:
            os.chown(password_file, pwd.getpwnam(self.user).pw_uid, -1)
        self._run("initdb", "-D", str(self.data), "-U", ADMIN, "--auth-local=trust", "--auth-host=scram-sha-256",
                  f"--pwfile={password_file}", "-E", "UTF8", "--no-sync", "--no-instructions")
        # fsync off: the tests kill writers and restart the server cleanly, never the machine
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -F -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
        self.admin(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
        return self

    def admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(host=str(self.root), port=self.port, user=ADMIN, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(statement)

    def restart(self) -> None:
        """A fast restart, as an operator's: open transactions are rolled back, connections dropped."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-m", "fast", "restart")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str, *, password: str = PASSWORD, port: int | None = None) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{port or self.port}/{database}"

    def new_database(self) -> str:
        """A URL of an empty database of its own (a test's history)."""
        self._databases += 1
        name = f"history_{os.getpid()}_{self._databases}"
        self.admin(f"CREATE DATABASE {name} OWNER {USER}")
        return self.url(name)
