"""Re-exported from ``devharness.services``, the harness's home (``bench/`` imports it there)."""

from __future__ import annotations

from devharness.services import (
    PG_PROBE_VAR,
    PG_URL_TEMPLATE,
    PG_URL_VAR,
    PRIVATE_VAR,
    REDIS_PROBE_VAR,
    REDIS_URL_TEMPLATE,
    REDIS_URL_VAR,
    START_TIMEOUT_S,
    RedisServer,
    ServiceUnavailable,
    TcpProxy,
    find_pg_ctl,
    postgres_admin_url,
    private_postgres,
    private_redis,
    redis_base_url,
    resolved_pg_admin_url,
)

__all__ = [
    "PG_PROBE_VAR",
    "PG_URL_TEMPLATE",
    "PG_URL_VAR",
    "PRIVATE_VAR",
    "REDIS_PROBE_VAR",
    "REDIS_URL_TEMPLATE",
    "REDIS_URL_VAR",
    "START_TIMEOUT_S",
    "RedisServer",
    "ServiceUnavailable",
    "TcpProxy",
    "find_pg_ctl",
    "postgres_admin_url",
    "private_postgres",
    "private_redis",
    "redis_base_url",
    "resolved_pg_admin_url",
]
