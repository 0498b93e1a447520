"""Whether a network engine keeps what it granted across a crash or a restart.

A lease the server forgets is a lease that can be granted twice: after a restart
that lost the last grants, a second holder gets a unit the first still uses.
Which configurations forget, and what this module can see of them:

* **Redis without an append-only file** (``appendonly no``) forgets every key on
  a restart, or keeps only the last snapshot (``save``), which may be minutes
  old: refused. With ``appendonly yes``, a restart of the server process loses
  nothing (the file is in the page cache); a crash of the machine loses the
  writes not yet synced: up to one second with ``appendfsync everysec`` (the
  default), none with ``always``. Replication is asynchronous: a replica
  promoted by Sentinel may lack the last writes, and nothing here can see a
  failover coming.
* **PostgreSQL with ``fsync = off``** may lose or corrupt committed rows on a
  crash of the machine: refused. With ``synchronous_commit = off`` for the
  session (the server's default or the role's), a crash of the server loses
  the transactions of its last few hundred milliseconds: refused too, since a
  role-level ``ALTER ROLE ... SET synchronous_commit = on`` fixes it for the
  coordinator alone. An asynchronous standby promoted by failover may lack the
  last commits, which nothing here can see either.

:func:`forgetful` asks the server over the engine's own connection (one call,
within the engine's timeout) and names what it found.
"""

from __future__ import annotations

import re
from typing import Any

from ._engine import Engine
from ._postgres import PostgresEngine
from ._redis import RedisEngine


def forgetful(engine: Engine[Any, Any]) -> str | None:
    """Why ``engine``'s server may forget a grant it acknowledged, or None.

    Only the PostgreSQL and Redis engines are asked; any other engine is None.

    Raises:
        StoreError: ``UNAVAILABLE`` when the server cannot be reached.
    """
    if isinstance(engine, RedisEngine):
        info = str(engine._run("INFO", "persistence"))
        found = re.search(r"^aof_enabled:(\d+)", info, re.MULTILINE)
        if found is not None and found[1] == "0":
            return (
                "the Redis server runs without an append-only file (appendonly no): a "
                "restart forgets the units it granted; set appendonly yes"
            )
        return None
    if isinstance(engine, PostgresEngine):
        row = engine._run(
            lambda conn: conn.execute(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit')"
            ).fetchone()
        )
        fsync, commit = row if row is not None else ("on", "on")
        if fsync == "off":
            return "the PostgreSQL server runs with fsync = off: a crash can lose what it granted"
        if commit == "off":
            return (
                "the PostgreSQL session runs with synchronous_commit = off: a crash loses the "
                "last grants; ALTER ROLE <the coordinator's role> SET synchronous_commit = on"
            )
    return None
