"""The development harness: real Receipt processes and services for the e2e tests, benchmarks and soak.

It starts what a deployment runs (gunicorn, the Celery workers, beat, ``receipt up``, a private
redis-server or PostgreSQL) by argv, and stops exactly what it started, by PID. It is the
repository's tooling, not the wheel's: no shipped package imports it (``make lint``).

- ``waiting``: ``wait_for`` (poll a condition against a deadline) and ``free_port``.
- ``processes``: the process harness (start by argv, stop by PID), the child environment.
- ``services``: PostgreSQL and Redis: the machine's, or private throwaway ones started with
  pytest-postgresql / pytest-redis when none answers; ``RedisServer``, ``TcpProxy``.
- ``databases``: fresh PostgreSQL databases cloned from a migrated template.
- ``stack``: one real deployment (gunicorn, workers, beat) and the helpers used against it.
- ``up``: ``receipt up`` started from its entry point, read from its banner.
- ``handlers``: the fake handlers every worker the harness starts loads.

A user's own handlers are tested in-process with ``receipt.testing`` instead.
"""
