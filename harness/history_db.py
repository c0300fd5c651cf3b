"""Where the run history lives and how it is reached: a SQLite file on one machine, or a
PostgreSQL server that a fleet of runners shares (``postgresql://user@host/db``, psycopg 3). One
schema and one set of statements serve both, through SQLAlchemy Core; what differs is how a
connection is opened and which failures are worth another try.

Guarantees, the same for both: a run goes in as one transaction; a run id is the primary key, so
two writers adding the same run leave it once (the second insert fails and is skipped); a writer
killed mid-run leaves nothing (the file's journal or the server rolls the open transaction back);
a server that drops the connection, restarts or refuses new ones for a moment is tried again for
up to RECONNECT_S. Anything else (a file locked past BUSY_TIMEOUT_S, not a database, a wrong
password, no such server) raises :class:`HistoryError`: one line naming the file or the URL, its
password hidden, which the callers say and go on.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import sqlalchemy as sa
    from sqlalchemy import event
    from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchModuleError
    from sqlalchemy.pool import NullPool
except ImportError:  # said when the history is used: a run's report never depends on it
    sa = None
    METADATA = RUNS = CASES = None

DEFAULT_PATH = Path("~/.cache/kvbits/history.sqlite")
SERVER_SCHEMES = ("postgresql", "postgresql+psycopg", "postgres")
DRIVER = "postgresql+psycopg"  # psycopg 3 (SQLAlchemy's plain postgresql:// means psycopg2)
INSTALL_HINT = "pip install 'kvbits[history]'"
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another's lock, on either backend
RECONNECT_S = 15.0  # how long a writer keeps trying a server that dropped or refused it (a restart)
RETRY_PAUSE_S = (0.05, 1.0)  # the first pause between tries and the longest, doubling in between

Location = Path | str  # a SQLite file, or a PostgreSQL URL


class HistoryError(RuntimeError):
    """The history cannot be used (locked, unreadable, unreachable, refused)."""


class HistoryMissing(HistoryError):
    """There is no history there yet: no such file, or a database without its tables."""


def is_server(location: Location) -> bool:
    return isinstance(location, str) and location.split("://", 1)[0].lower() in SERVER_SCHEMES


def as_location(value: str | os.PathLike | None) -> Location | None:
    """A URL as it is, anything else as a path (``~`` expanded); None stays None."""
    if value is None:
        return None
    text = os.fspath(value)
    return text if is_server(text) else Path(text).expanduser()


def history_location(environ=os.environ) -> Location:
    """``$KVH_HISTORY`` (a path or a PostgreSQL URL), else ``~/.cache/kvbits/history.sqlite``."""
    return as_location(environ.get("KVH_HISTORY") or DEFAULT_PATH)


def shown(location: Location) -> str:
    """The location as it may be printed: a URL's password (in the user part or a ``password``
    parameter) replaced by ``***``."""
    if not is_server(location):
        return str(location)
    parts = urlsplit(location)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}{':***' if ':' in user else ''}@{host}"
    query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="*/")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _tables():
    metadata = sa.MetaData()
    runs = sa.Table(
        "runs", metadata,
        sa.Column("run_id", sa.Text, primary_key=True),
        *(sa.Column(name, sa.Text) for name in ("leg", "mode", "gpu", "commit_sha", "torch", "triton", "started",
                                                 "finished")),
        sa.Column("complete", sa.Integer),
    )
    cases = sa.Table(
        "cases", metadata,
        # the order cases went in: in SQLite exactly its own row id (INTEGER PRIMARY KEY), which files
        # written before it was declared have too; on a server an identity column
        sa.Column("rowid", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Text, sa.ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
        *(sa.Column(name, sa.Text) for name in ("suite", "nodeid", "variant", "backend", "device", "outcome")),
        sa.Column("duration_s", sa.Float),
        sa.Column("metrics", sa.Text),
    )
    sa.Index("cases_by_case", cases.c.nodeid, cases.c.variant)
    sa.Index("cases_by_run", cases.c.run_id)  # a server indexes no foreign key by itself: prune's cascade needs it
    return metadata, runs, cases


if sa is not None:
    METADATA, RUNS, CASES = _tables()


def _need_sqlalchemy(location: Location) -> None:
    if sa is None:
        raise HistoryError(f"history {shown(location)}: the run history needs SQLAlchemy ({INSTALL_HINT})")


def _server_engine(location: str, connect_timeout_s: float):
    try:
        url = sa.make_url(location)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise HistoryError(f"history {shown(location)}: not a PostgreSQL URL ({exc}); expected "
                           f"postgresql://user:password@host:port/database") from exc
    try:
        return sa.create_engine(url.set(drivername=DRIVER), poolclass=NullPool, connect_args={
            "connect_timeout": max(2, round(connect_timeout_s)),  # libpq's least is 2 s
            "options": f"-c lock_timeout={round(BUSY_TIMEOUT_S * 1000)}",  # as SQLite's busy timeout
            "application_name": "kvbits-history",
        })
    except (ImportError, NoSuchModuleError) as exc:
        raise HistoryError(f"history {shown(location)}: a PostgreSQL history needs psycopg 3 ({INSTALL_HINT})") from exc


def _sqlite_engine(path: Path, *, read_only: bool, timeout_s: float):
    """A SQLite engine; a writer's transactions begin IMMEDIATE (the write lock first, so two
    writers queue on the busy timeout instead of one failing at its first write)."""
    if read_only:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        engine = sa.create_engine("sqlite://", poolclass=NullPool, creator=lambda: sqlite3.connect(
            uri, uri=True, timeout=timeout_s, isolation_level=None, check_same_thread=False))
    else:
        engine = sa.create_engine("sqlite://", poolclass=NullPool, creator=lambda: sqlite3.connect(
            path, timeout=timeout_s, isolation_level=None, check_same_thread=False))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.execute("PRAGMA foreign_keys=ON")
        if not read_only:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")  # readers go on beside one writer

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def _first_words(exc: BaseException) -> str:
    """The driver's own message on one line (SQLAlchemy's adds the statement and its parameters)."""
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split())[:400] or type(orig).__name__


def _busy(exc: BaseException) -> bool:
    text = _first_words(exc)
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


# A server that answered the login with FATAL refused it for good, unless it was starting or stopping.
_PASSING_REFUSALS = ("starting up", "shutting down", "in recovery mode", "not yet accepting connections",
                     "administrator command")


def _worth_retrying(exc: BaseException) -> bool:
    """Whether a server's failure may pass: a dropped connection, a refused or timed-out connect, a
    server starting or stopping, a serialization failure or deadlock. A SQLite file's failures
    never do (its busy timeout has waited already)."""
    if sa is None or not isinstance(exc, DBAPIError) or isinstance(exc, IntegrityError):
        return False
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate:
        return sqlstate in ("40001", "40P01") or sqlstate.startswith(("08", "57P"))
    text = _first_words(exc)
    if isinstance(exc.orig, sqlite3.Error) or "failed to resolve host" in text:
        return False
    return "FATAL:" not in text or any(words in text for words in _PASSING_REFUSALS)


def explain(location: Location, exc: BaseException, *, waited_s: float | None = None) -> str:
    """One line saying what is wrong with the history at ``location`` and what to do."""
    where, text = shown(location), _first_words(exc)
    if not is_server(location):
        if _busy(exc):
            return f"history {where}: locked by another process for more than {BUSY_TIMEOUT_S:g} s ({text})"
        if "not a database" in text or "malformed" in text:
            return (f"history {where}: not a readable SQLite database ({text}); move it aside to start a new "
                    f"history, or set KVH_HISTORY to another file")
        return f"history {where}: {type(getattr(exc, 'orig', None) or exc).__name__}: {text}"
    if "password authentication failed" in text or "no pg_hba.conf entry" in text:
        return f"history {where}: the server refused the login ({text}); check the user and password in KVH_HISTORY"
    if "lock timeout" in text:
        return f"history {where}: locked by another writer for more than {BUSY_TIMEOUT_S:g} s ({text})"
    if waited_s is not None:
        return f"history {where}: cannot reach the PostgreSQL server, tried for {waited_s:g} s ({text})"
    return f"history {where}: the PostgreSQL server cannot be used ({text})"


def retrying(location: Location, work: Callable[[int], object], *, patience_s: float | None = None):
    """``work(attempt)`` (attempt 1, 2, ...) again while a server's failure may pass, for up to
    ``patience_s`` (default RECONNECT_S) from the first failure; any other failure, or one past
    that, as HistoryError. IntegrityError is the caller's (a run already there)."""
    patience_s = RECONNECT_S if patience_s is None else patience_s
    pause, deadline, attempt = RETRY_PAUSE_S[0], None, 0
    while True:
        attempt += 1
        try:
            return work(attempt)
        except HistoryError:
            raise
        except IntegrityError:
            raise
        except (DBAPIError, sqlite3.Error, OSError) as exc:
            if not _worth_retrying(exc):
                raise HistoryError(explain(location, exc)) from exc
            deadline = deadline or time.monotonic() + patience_s
            if time.monotonic() + pause > deadline:
                raise HistoryError(explain(location, exc, waited_s=patience_s)) from exc
            time.sleep(pause)
            pause = min(2 * pause, RETRY_PAUSE_S[1])


def _create_schema(location: Location, engine) -> None:
    """The tables and indexes, where missing. Two processes creating them at once can collide
    (SQLite: refused at once without the busy wait; a server: the second CREATE fails on the
    first's name): tried again until BUSY_TIMEOUT_S."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            with engine.connect() as connection:
                METADATA.create_all(connection, checkfirst=True)
                for index in (*RUNS.indexes, *CASES.indexes):
                    index.create(connection, checkfirst=True)  # those a table made by an older version lacks
                connection.commit()
            return
        except (DBAPIError, sqlite3.Error) as exc:
            sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
            collided = _busy(exc) or sqlstate in ("23505", "42P07")  # a server's unique or duplicate table
            if not collided or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def writer(location: Location, *, patience_s: float | None = None) -> Iterator:
    """An engine that writes the history at ``location`` (created, tables and all, where missing)."""
    _need_sqlalchemy(location)
    if is_server(location):
        engine = _server_engine(location, BUSY_TIMEOUT_S)
    else:
        try:
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(explain(location, exc)) from exc
        engine = _sqlite_engine(Path(location), read_only=False, timeout_s=BUSY_TIMEOUT_S)
    try:
        retrying(location, lambda _attempt: _create_schema(location, engine), patience_s=patience_s)
        yield engine
    finally:
        engine.dispose()


@contextmanager
def reader(location: Location, timeout_s: float = BUSY_TIMEOUT_S) -> Iterator:
    """An open connection that only reads the history at ``location``, waiting at most about
    ``timeout_s`` for a lock or a server; HistoryMissing where there is none yet (a reader
    creates nothing), HistoryError where it cannot be read."""
    _need_sqlalchemy(location)
    if is_server(location):
        engine = _server_engine(location, timeout_s)
    elif not Path(location).is_file():
        raise HistoryMissing(f"history {shown(location)}: no such file")
    else:
        engine = _sqlite_engine(Path(location), read_only=True, timeout_s=timeout_s)
    try:
        def connect(_attempt):
            connection = engine.connect()
            try:
                has_runs = sa.inspect(connection).has_table("runs")
            except BaseException:
                connection.close()
                raise
            if not has_runs:
                connection.close()
                raise HistoryMissing(f"history {shown(location)}: holds no run history yet (no runs table)")
            return connection

        connection = retrying(location, connect, patience_s=min(timeout_s, RECONNECT_S))
        try:
            yield connection
        except (DBAPIError, sqlite3.Error) as exc:
            raise HistoryError(explain(location, exc)) from exc
        finally:
            connection.close()
    finally:
        engine.dispose()
