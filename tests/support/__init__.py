"""Test support shared by ``tests/`` and ``bench/``: each conftest keeps only its fixtures.

- ``waiting``: ``wait_for`` (poll a condition against a deadline) and ``free_port``.
- ``processes``: the process harness (start by argv, stop by PID), the child environment.
- ``services``: PostgreSQL and Redis for the tests: the machine's, or private throwaway ones
  started with pytest-postgresql / pytest-redis when none answers; ``RedisServer``, ``TcpProxy``.
- ``databases``: fresh databases cloned from a migrated template; the projection == fold check.
- ``stack``: one real deployment (gunicorn, workers, beat) and the helpers tests use against it.
- ``queue_ops``: queue transitions only tests drive directly (no production caller).
"""
