"""The Django site of ``bench/django_bench.py``: one view doing two ORM queries.

``BENCH_DJANGO_DATABASE`` (JSON) is the ``DATABASES["default"]`` entry, so
one site runs under every contender: the engine, Django's own pool, PgBouncer.
"""
