"""A Django database engine: Django's PostgreSQL backend with a host-wide pool.

Django 5.1's own pool (``OPTIONS["pool"]``) is psycopg_pool's, one per worker
process, so 8 gunicorn workers with ``max_size=4`` may open 32 connections.
This engine keeps Django's PostgreSQL backend (psycopg 3) and takes each
connection from a :class:`~orbitive.clients.psycopg.ConnectionPool` whose
limits hold across every process of a fleet::

    DATABASES = {"default": {
        "ENGINE": "orbitive.clients.django",
        "NAME": "app", "USER": "app", "HOST": "db", "PORT": 5432,
        "OPTIONS": {"pool": {"fleet": "web", "max_live": 8, "max_idle": 4,
                             "min_idle": 0, "timeout": 10}},
    }}

``OPTIONS["pool"]`` takes:

* ``fleet`` (required): the fleet's name, the same in every worker of the host;
* ``fleet_capacity``: the fleet's node count, one node for each process that
  may be alive at once (the workers, their replacements during a reload, a
  preloading master that used the database); by default the fleet's own, or
  64 for a new fleet;
* ``max_live``, ``min_idle``, ``max_idle`` (counts, host-wide), ``max_waiting``
  (callers of one process), ``timeout`` (seconds a checkout waits),
  ``idle_timeout``, ``max_lifetime``, ``handoff_after`` (seconds, floats) and
  ``handoff_uses``, as :class:`~orbitive.clients.PoolOptions` (``timeout`` is
  its ``acquire_timeout``);
* ``budget``: one connection budget shared with other hosts, a dict of
  :class:`~orbitive.clients.Budget`'s arguments (``url``, ``name`` and
  ``total`` required; ``ttl``, ``handover_within``).

False or None opens every connection directly, as without a pool. Anything
else raises ``ImproperlyConfigured`` when Django builds the connection (the
first use of ``connections[alias]``: ``manage.py check --database default``,
``migrate``, the test runner, a worker's first request): a missing
``OPTIONS["pool"]`` or ``fleet``, True, an unknown key, psycopg_pool's
``min_size``/``max_size`` (the message names the host-wide option to use), a
value out of range, or ``CONN_MAX_AGE`` other than 0.

As with Django's own pool:

* ``CONN_MAX_AGE`` must be 0: Django closes the connection at the end of each
  request (``close_old_connections()``), which hands it back to the pool;
  ``connection.close()`` hands it back at once;
* ``CONN_HEALTH_CHECKS`` True checks each connection as it is checked out;
* a connection comes back rolled back, with its session otherwise as it was
  left (a ``LISTEN``, a session advisory lock or a ``SET`` stays).

A connection never leaves the process that made it, so transactions,
``select_for_update()``, server-side cursors (``.iterator()``), ``LISTEN``
and advisory locks work as without a pool. The pool and the fleet are built
per process on the first connection: a child forked by a preloading master
never uses its parent's pool or connections (it keeps them, untouched, and
makes its own), and a process closes its pools at exit. No connection within
``timeout`` raises ``django.db.OperationalError`` (as psycopg_pool's
``PoolTimeout`` does under Django's pool), with
:class:`~orbitive.clients.PoolTimeout` in its cause chain.

Needs Django 4.2 or later and psycopg 3 (the ``django`` extra).
"""

from __future__ import annotations

__all__: list[str] = []
