"""Test support: each conftest keeps only its fixtures.

The process harness (``waiting``, ``processes``, ``services``, ``stack``, ``up``) lives in
``devharness``, which ``bench/`` imports too; the modules of those names here re-export it for the
tests (``stack.make_stack`` skips a test when redis-server is missing). Test-only helpers:

- ``databases``: a missing service's skip (a failure in CI) and the projection == fold check;
  fresh databases re-exported from ``devharness.databases``.
- ``api``: the API in-process (Flask test client over a given engine), tokens, an SSE reader,
  ``json_of`` (a response's JSON, typed for indexing).
- ``queue_ops``: queue transitions only tests drive directly (no production caller).
- ``clock``, ``fake_redis``, ``authz_matrix``: a hand-moved loop clock, Redis in memory, the
  authorization matrix.
"""
