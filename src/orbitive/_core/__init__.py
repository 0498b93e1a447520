"""The substrate every table stands on; nothing here is public API.

Fleet membership (:mod:`._fleet`), shared-memory objects and their access checks
(:mod:`._region`, :mod:`._access`), each object's critical section and its robust
mutex twins (:mod:`._section`, :mod:`._robust` and the C ``_robust_c``), readiness
across processes (:mod:`._readiness` with its futex and pipe backends), the clock
and TTL checks, fork hooks, byte arguments, and every error class
(:mod:`._errors`). The public names are re-exported by ``orbitive`` and its
subpackages; ``docs/architecture.md`` maps the whole tree.
"""
