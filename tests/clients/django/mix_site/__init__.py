"""A Django site whose four views mix what transaction mode must keep honest (issue 32):
plain reads, ``atomic()`` writes under ``select_for_update()``, a savepoint rolled
back, and ``.iterator()`` (a server-side cursor). Served by gunicorn in
``test_transaction_mix.py``; settings from the environment (``MIX_*``)."""
