"""The one configuration object: every environment variable Receipt reads, each declared once.

A ``Settings`` field is declared by ``setting(...)``: its environment name, its default (as the
text an operator would write), its parser, its doc line, and whether its value is a secret or a
URL that may carry one. Everything else is derived from those fields: ``SETTINGS``,
``Settings.from_env``, ``redacted`` (``receipt config``, the dashboard's system page), the secret
texts that log lines and error messages never carry (``app/redaction.py``), and the README's
configuration table (``receipt config --markdown``; a test checks the README against it). So a
new setting is one declaration, and a new secret is hidden everywhere by its mark alone.

On/off settings all go through one parser, ``switch``.
Spec floors, clamps and caps are *not* applied here: they are rules, and they live with the
rule that needs them (``app/timing.py``), each in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Self, TypeVar, overload
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

MASK: Final = "***"
# The key under which a Settings field's metadata holds its declaration.
DECLARATION: Final = "receipt.setting"


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default (as text, ``None`` for unset), purpose and marks.

    ``secret``: the whole value is a secret, shown as ``***``. ``url``: the value is a URL whose
    password and query string (where tokens ride) are shown as ``***``.
    """

    env: str
    default: str | None
    doc: str
    parse: Callable[[str], Any] = str
    secret: bool = False
    url: bool = False
    attr: str = ""  # the Settings field holding it, filled in when SETTINGS is derived

    def __post_init__(self) -> None:
        if self.secret and self.url:
            raise ValueError(f"{self.env}: a setting is a secret or a URL, not both")

    def shown(self, value: Any) -> Any:
        """``value`` as it may be shown anywhere: a secret as ``***``, a URL without its password."""
        if value is None or value == "":
            return value
        if self.secret:
            return MASK
        if self.url:
            return mask_url(str(value))
        return value


# -- parsers --------------------------------------------------------------------------------

ON: Final = ("enabled", "on", "true", "yes", "1")
OFF: Final = ("disabled", "off", "false", "no", "0")


def switch(text: str) -> bool:
    """The one on/off parser: ``enabled``/``disabled``, or on/off, true/false, yes/no, 1/0 (any case)."""
    value = text.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError("allowed values: enabled, disabled (or on/off, true/false, yes/no, 1/0)")


def _int(text: str) -> int:
    return int(text.strip())


def _at_least_one(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        raise ValueError("must be 1 or more")
    return value


def _days(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("must be 0 (keep everything) or a positive number of days")
    return value


def _ms_up_to(most: int, zero: str) -> Callable[[str], int]:
    """A parser of whole milliseconds from 0 (which means ``zero``) to ``most``."""

    def parse(text: str) -> int:
        value = int(text.strip())
        if not 0 <= value <= most:
            raise ValueError(f"must be 0 ({zero}) to {most} ms")
        return value

    return parse


# How far ahead of its time an `allow` schedule's tick may be decided: five minutes keeps the jobs
# waiting ahead few, and a withdrawal's cancels one short transaction.
SCHEDULE_LEAD_MAX_MS = 300_000
_lead_ms = _ms_up_to(SCHEDULE_LEAD_MAX_MS, "decide each tick at its time")
# The longest fetched attempts may wait for their process's slots: past a minute another process
# with a free slot should have them.
DELIVERY_HOLD_MAX_MS = 60_000
_hold_ms = _ms_up_to(DELIVERY_HOLD_MAX_MS, "hand back at once")


# The longest an API process reuses what a token stood for: a revocation made elsewhere is seen
# within it, so it stays short.
TOKEN_CACHE_MAX_MS = 60_000
_token_cache_ms = _ms_up_to(TOKEN_CACHE_MAX_MS, "ask the database on every request")


# The longest a session may sit idle inside a transaction before PostgreSQL ends it: a dispatch
# pass holds its queue's lock in one, so past ten minutes one stalled client stops a queue that long.
IDLE_IN_TRANSACTION_MAX_MS = 600_000
_idle_in_transaction_ms = _ms_up_to(IDLE_IN_TRANSACTION_MAX_MS, "no limit")


# The longest a starting process waits for an unreachable database or broker: past an hour a
# platform's own restart policy is the better judge.
STARTUP_WAIT_MAX_S = 3600
# The longest an unfetched worker message may wait before it is sent again: a minute is already
# the slow recovery this bound exists to avoid.
REDELIVER_UNFETCHED_MAX_MS = 60_000


def _startup_wait_s(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= STARTUP_WAIT_MAX_S:
        raise ValueError(f"must be 0 (fail at once) to {STARTUP_WAIT_MAX_S} s")
    return value


def _redeliver_ms(text: str) -> int:
    value = int(text.strip())
    if not 1000 <= value <= REDELIVER_UNFETCHED_MAX_MS:
        raise ValueError(f"must be 1000 to {REDELIVER_UNFETCHED_MAX_MS} ms")
    return value


def _percent(text: str) -> int:
    value = int(text.strip())
    if not 1 <= value <= 100:
        raise ValueError("must be a whole percentage from 1 to 100")
    return value


def _retention_overrides(text: str) -> tuple[tuple[str, int], ...]:
    pairs: dict[str, int] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        org, sep, days = item.partition("=")
        if not sep or not org.strip() or not days.strip().isdigit():
            raise ValueError(f"{item.strip()!r}: expected org=days (days a whole number, 0 keeps everything)")
        pairs[org.strip()] = int(days)
    return tuple(sorted(pairs.items()))


# An organisation's dispatch policy (app/dispatch/policies.py): its weight in the fair share of a
# worker group's free slots, and the most dispatches a second it may get across every process. The
# API's values (PUT /organizations/{id}/dispatch) are bounded the same way.
ORG_WEIGHT_MAX: Final = 100.0
ORG_WEIGHT_RULE: Final = f"must be a number above 0 and at most {ORG_WEIGHT_MAX:g}"
ORG_RATE_MAX_PER_S: Final = 100_000.0
ORG_RATE_RULE: Final = f"must be a number of dispatches per second above 0 and at most {ORG_RATE_MAX_PER_S:g}"
_RATE_UNITS: Final = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}


def _org_pairs(text: str, form: str, value: Callable[[str, str], float]) -> tuple[tuple[str, float], ...]:
    """``org=value`` pairs, comma-separated, each organisation once, sorted by organisation."""
    pairs: dict[str, float] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        org, sep, rest = item.partition("=")
        org = org.strip()
        if not sep or not org or any(c.isspace() for c in org):
            raise ValueError(f"{item!r}: expected {form}")
        if org in pairs:
            raise ValueError(f"{org} is given twice")
        pairs[org] = value(rest.strip(), item)
    return tuple(sorted(pairs.items()))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _weight(text: str, item: str) -> float:
    value = _number(text)
    if value is None or not 0 < value <= ORG_WEIGHT_MAX:
        raise ValueError(f"{item!r}: the weight {ORG_WEIGHT_RULE}")
    return value


def _rate(text: str, item: str) -> float:
    try:
        return rate_per_s(text)
    except ValueError as exc:
        if str(exc) == ORG_RATE_RULE:
            raise ValueError(f"{item!r}: the rate {ORG_RATE_RULE}") from None
        raise ValueError(f"{item!r}: expected org=N/s, org=N/min or org=N/h (e.g. org-a=20/s)") from None


# Fair dispatch (docs/dispatch.md): the broker may hold at most this many attempts per live worker
# process beyond the group's free slots; past that an attempt waits in PostgreSQL, where the pass
# can still choose fairly.
DISPATCH_LEAD_MAX = 64
# A key prefix in RECEIPT_CONCURRENCY_LIMITS / RECEIPT_RATE_LIMITS: a concurrency key's alphabet.
_KEY_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-")


def _refill_coalesce_ms(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= 1000:
        raise ValueError("must be 0 to 1000 ms")
    return value


def _dispatch_lead(text: str) -> int:
    value = int(text.strip())
    if not 0 <= value <= DISPATCH_LEAD_MAX:
        raise ValueError(f"must be 0 to {DISPATCH_LEAD_MAX} attempts per worker process")
    return value


def _prefix_pairs(
    text: str, value_rule: str, parse_value: Callable[[str], Any]
) -> tuple[tuple[str, Any], ...]:
    """``prefix=value,prefix=value`` as pairs, longest prefix first (the first match wins)."""
    pairs: dict[str, Any] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        prefix, sep, raw = entry.partition("=")
        prefix = prefix.strip()
        if not sep or not prefix or not set(prefix) <= _KEY_PREFIX_CHARS or len(prefix) > 128:
            raise ValueError(
                f"{entry!r} is not prefix={value_rule}: a key prefix of 1-128 letters, digits, "
                "'.', '_', ':', '/' or '-'"
            )
        try:
            pairs[prefix] = parse_value(raw.strip())
        except ValueError:
            raise ValueError(f"{entry!r}: the value {value_rule}") from None
    return tuple(sorted(pairs.items(), key=lambda kv: (-len(kv[0]), kv[0])))


def _limit(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= 1000:
        raise ValueError
    return value


def rate_per_s(raw: str) -> float:
    """``20/s``, ``300/min`` or ``5000/h`` (``sec``, ``second``, ``minute``, ``hour`` too) as
    dispatches per second: more than 0, at most ``ORG_RATE_MAX_PER_S``. The one rate parser of the
    key and organisation limits."""
    count, sep, unit = raw.partition("/")
    per = _RATE_UNITS.get(unit.strip().lower()) if sep else None
    value = _number(count.strip())
    if per is None or value is None:
        raise ValueError("must be N/s, N/min or N/h")
    per_s = value / per
    if not 0 < per_s <= ORG_RATE_MAX_PER_S:
        raise ValueError(ORG_RATE_RULE)
    return per_s


def _concurrency_limits(text: str) -> tuple[tuple[str, int], ...]:
    return _prefix_pairs(text, "must be a limit from 1 to 1000", _limit)


def _rate_limits(text: str) -> tuple[tuple[str, float], ...]:
    return _prefix_pairs(
        text, f"must be a rate N/s, N/min or N/h (at most {ORG_RATE_MAX_PER_S:g}/s)", rate_per_s
    )


def _org_weights(text: str) -> tuple[tuple[str, float], ...]:
    return _org_pairs(text, "org=weight (e.g. org-a=3)", _weight)


def _org_rates(text: str) -> tuple[tuple[str, float], ...]:
    return _org_pairs(text, "org=N/s, org=N/min or org=N/h (e.g. org-a=20/s)", _rate)


def _log_format(text: str) -> str:
    value = text.strip().lower()
    if value not in ("plain", "json"):
        raise ValueError("allowed values: plain, json")
    return value


TRACE_ID_PLACEHOLDER = "{traceId}"


def _trace_url_template(text: str) -> str:
    value = text.strip()
    if TRACE_ID_PLACEHOLDER not in value:
        raise ValueError(f"must contain {TRACE_ID_PLACEHOLDER}, which each job's trace id replaces")
    return value


# -- the declaration --------------------------------------------------------------------------


@overload
def setting(
    env: str, default: str, doc: str, parse: Callable[[str], T], *, secret: bool = ..., url: bool = ...
) -> T: ...
@overload
def setting(
    env: str, default: None, doc: str, parse: Callable[[str], T], *, secret: bool = ..., url: bool = ...
) -> T | None: ...
@overload
def setting(env: str, default: str, doc: str, *, secret: bool = ..., url: bool = ...) -> str: ...
@overload
def setting(env: str, default: None, doc: str, *, secret: bool = ..., url: bool = ...) -> str | None: ...
def setting(
    env: str,
    default: str | None,
    doc: str,
    parse: Callable[[str], Any] = str,
    *,
    secret: bool = False,
    url: bool = False,
) -> Any:
    """Declare one ``Settings`` field: the field's default is ``parse(default)``, so the text the
    README shows and the value a bare ``Settings()`` holds are one fact."""
    declaration = Setting(env, default, doc, parse, secret, url)
    return field(default=None if default is None else parse(default), metadata={DECLARATION: declaration})


@dataclass(frozen=True, repr=False)
class Settings:
    """Parsed settings. Build with ``Settings.from_env``; pass it in, never read os.environ deeper down.

    ``Settings(field=value)`` builds one directly (tests do); an on/off field also takes its
    environment spelling there (``auth="disabled"``), read by the same ``switch`` parser.
    """

    # -- storage and broker
    database_url: str | None = setting(
        "DATABASE_URL",
        None,
        "Database URL. Unset: the embedded SQLite file `$RECEIPT_HOME/receipt.db`. `postgres://` and "
        "`postgresql://` are normalised to the psycopg2 driver.",
        url=True,
    )
    db_pool_size: int = setting(
        "RECEIPT_DB_POOL_SIZE",
        "10",
        "PostgreSQL connections each process (each gunicorn worker, each Celery worker or driver "
        "process) keeps open between uses; under load it opens up to 20 more, closed again when "
        "returned. Budget `max_connections` as processes x (this + 20), plus two per worker process "
        "for its liveness renewals. Lower it where many processes share a small database plan.",
        _at_least_one,
    )
    db_prepared_statements: bool = setting(
        "RECEIPT_DB_PREPARED_STATEMENTS",
        "disabled",
        "`enabled` prepares each hot statement once per PostgreSQL connection (server-side "
        "`PREPARE`): less database CPU per job. Keep `disabled` behind a transaction-mode pooler "
        "(PgBouncer `pool_mode=transaction`), where prepared statements do not follow a client's "
        "connection.",
        switch,
    )
    db_idle_in_transaction_ms: int = setting(
        "RECEIPT_DB_IDLE_IN_TRANSACTION_MS",
        "10000",
        "PostgreSQL ends a session of this process's that sits this long idle inside a transaction "
        "(`idle_in_transaction_session_timeout`, set once per connection), so its locks go with it: a "
        "process frozen or cut off from the database mid-pass then holds its queue's dispatch lock "
        "this long at most, not until its TCP connection dies. Receipt's own transactions wait "
        "between statements for milliseconds (a bulk archive's page, for its segment file's write). "
        "`0`: no limit. At most 600000.",
        _idle_in_transaction_ms,
    )
    redis_url: str | None = setting(
        "REDIS_URL",
        None,
        "Celery broker URL (Redis in production). Unset: the embedded filesystem broker under "
        "`$RECEIPT_HOME/broker`.",
        url=True,
    )
    home: str = setting(
        "RECEIPT_HOME",
        "./.receipt",
        "Folder for the embedded default's database file, broker folders and logs.",
    )
    # -- API
    auth: bool = setting(
        "RECEIPT_AUTH",
        "enabled",
        "`enabled` (Bearer tokens on every endpoint but /healthz) or `disabled` (anonymous; warns on "
        "every response).",
        switch,
    )
    token_cache_ms: int = setting(
        "RECEIPT_TOKEN_CACHE_MS",
        "1000",
        "How long an API process reuses what a token stands for (organisation, scopes, expiry, which "
        "is checked on every request) before asking the database again; a token revoked from another "
        "process stops working within this. 0: ask on every request; at most 60000.",
        _token_cache_ms,
    )
    max_body_bytes: int = setting(
        "RECEIPT_MAX_BODY_BYTES",
        "1048576",
        "Largest request body the API accepts; larger gets 413.",
        _int,
    )
    sse_poll_ms: int = setting(
        "RECEIPT_SSE_POLL_MS",
        "250",
        "How often the API process's one event-stream poller asks which open streams advanced (one "
        "query for all of them).",
        _int,
    )
    sse_max_seconds: int = setting(
        "RECEIPT_SSE_MAX_SECONDS",
        "300",
        "Longest an event stream stays open before the server ends it (the client resumes with "
        "Last-Event-ID).",
        _int,
    )
    # -- leases and timeouts (spec: "Leases, timeouts and heartbeats")
    job_lease_ms: int = setting(
        "JOB_LEASE_MS",
        "300000",
        "Default job lease.",
        _int,
    )
    factory_control_job_lease_ms: int = setting(
        "FACTORY_CONTROL_JOB_LEASE_MS",
        "900000",
        "Lease for `factory-control` running `factory.objective.control` (the larger of this and "
        "JOB_LEASE_MS).",
        _int,
    )
    factory_control_job_execution_timeout_ms: int | None = setting(
        "FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS",
        None,
        "May lower the execution timeout of objective control jobs only.",
        _int,
    )
    codex_job_lease_ms: int = setting(
        "CODEX_JOB_LEASE_MS",
        "900000",
        "Lease for `codex` jobs and computer-path `factory.task.monitor` jobs.",
        _int,
    )
    active_stale_ms: int = setting(
        "RECEIPT_RESONATE_ACTIVE_STALE_MS",
        "600000",
        "Heartbeat cadence is a third of the smaller of the lease and this.",
        _int,
    )
    heartbeat_interval_ms: int | None = setting(
        "RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS",
        None,
        "Can only lower the derived heartbeat cadence, never raise it.",
        _int,
    )
    # -- recovery loops
    queued_redrive_interval_ms: int = setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS",
        "15000",
        "Interval of the queued-job redrive loop.",
        _int,
    )
    queued_redrive_startup_delay_ms: int = setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_STARTUP_DELAY_MS",
        "5000",
        "Delay before the first redrive pass after start.",
        _int,
    )
    queued_redrive_min_age_ms: int = setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS",
        "30000",
        "A queued job younger than this is left to its own dispatch.",
        _int,
    )
    queued_redrive_cooldown_ms: int = setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS",
        "15000",
        "Least time between two redrives of the same job.",
        _int,
    )
    lease_expiry_interval_ms: int = setting(
        "RECEIPT_LEASE_EXPIRY_INTERVAL_MS",
        "5000",
        "Interval of the lease-expiry loop (appends `job.lease_expired` for leases past their deadline).",
        _int,
    )
    retry_backoff_ms: int = setting(
        "RECEIPT_RETRY_BACKOFF_MS",
        "1000",
        "Delay before the first retry of a retryable failure; doubles each attempt. `0` retries at once.",
        _int,
    )
    retry_backoff_max_ms: int = setting(
        "RECEIPT_RETRY_BACKOFF_MAX_MS",
        "60000",
        "Cap of the retry delay.",
        _int,
    )
    retry_scan_interval_ms: int = setting(
        "RECEIPT_RETRY_SCAN_INTERVAL_MS",
        "1000",
        "Interval of the loop that dispatches retries whose delay has passed.",
        _int,
    )
    startup_settle_ms: int = setting(
        "RESONATE_STARTUP_SETTLE_MS",
        "1000",
        "Settle time before objective resume runs at startup (every process role, once, single-flight).",
        _int,
    )
    objective_control_outbox_redrive_interval_ms: int = setting(
        "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS",
        "5000",
        "Interval of the objective-control outbox redrive (celery beat; runs on `worker-control` and `all`).",
        _int,
    )
    objective_control_outbox_redrive_timeout_ms: int = setting(
        "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS",
        "15000",
        "Observational deadline of one outbox redrive pass: a slower pass keeps running and logs "
        "`factory.control_outbox_redrive_slow`.",
        _int,
    )
    objective_watchdog_cron: str = setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON",
        "* * * * *",
        "Cron schedule of the objective watchdog (celery beat; standard 5 fields; an invalid "
        "expression stops beat at start). Each tick enqueues one `factory.objective.watchdog` job on "
        "`factory-control`.",
    )
    objective_watchdog_enabled: bool = setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED",
        "1",
        "`0` turns the objective watchdog off (beat schedules no tick).",
        switch,
    )
    objective_watchdog_timeout_ms: int = setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS",
        "60000",
        "Deadline of one watchdog pass (floor 10 000 ms): paging stops there and the result says `timedOut`.",
        _int,
    )
    objective_watchdog_scan_limit: int = setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT",
        "200",
        "Active objectives the watchdog reads per page, oldest first (clamped to 1..2000).",
        _int,
    )
    schedule_scan_interval_ms: int = setting(
        "RECEIPT_SCHEDULE_SCAN_INTERVAL_MS",
        "1000",
        "Interval of the schedules pass, which fires every due schedule tick: a tick fires within "
        "about one interval of its time (beat, or the local ticker of a `receipt-maintenance` consumer).",
        _int,
    )
    schedule_page_size: int = setting(
        "RECEIPT_SCHEDULE_PAGE_SIZE",
        "500",
        "Schedules one transaction of the schedules pass decides; a pass takes every due schedule, "
        "page by page.",
        _int,
    )
    schedule_lead_ms: int = setting(
        "RECEIPT_SCHEDULE_LEAD_MS",
        "0",
        "How long before its tick an `allow` schedule's tick is decided, its job enqueued to wait "
        "for the tick (`availableAt`): thousands of schedules on one tick are then spread over the "
        "passes before it. Pausing, changing or deleting a schedule withdraws its ticks decided "
        "ahead. `0` decides each tick at its time; at most 300000.",
        _lead_ms,
    )
    retention_days: int = setting(
        "RECEIPT_RETENTION_DAYS",
        "0",
        "Days a job or objective stays in the database after it ended; the archiving pass then moves "
        "its receipts to the archive (`RECEIPT_ARCHIVE_DIR`) and leaves a tombstone. `0` keeps "
        "everything: nothing leaves an audit log unless an operator asks (`docs/runbook.md`, Retention).",
        _days,
    )
    retention_days_by_organization: tuple[tuple[str, int], ...] = setting(
        "RECEIPT_RETENTION_DAYS_BY_ORGANIZATION",
        "",
        "Per-organisation windows overriding `RECEIPT_RETENTION_DAYS`: `org=days` pairs, comma-separated "
        "(`acme=30,audited=0`; `0` keeps that organisation's history).",
        _retention_overrides,
    )
    archive_dir: str | None = setting(
        "RECEIPT_ARCHIVE_DIR",
        None,
        "Where the archiving pass writes segments (gzip JSON lines, one receipt a line). Unset: "
        "`$RECEIPT_HOME/archive`.",
    )
    archive_interval_ms: int = setting(
        "RECEIPT_ARCHIVE_INTERVAL_MS",
        "3600000",
        "Interval of the archiving pass (runs only where a retention window is set).",
        _int,
    )
    archive_page_size: int = setting(
        "RECEIPT_ARCHIVE_PAGE_SIZE",
        "500",
        "Streams one segment (and one transaction) of the archiving pass holds.",
        _int,
    )
    archive_duty_percent: int = setting(
        "RECEIPT_ARCHIVE_DUTY_PERCENT",
        "50",
        "The share of its running time the archiving pass spends working (1-100): after each page it "
        "rests for as long as that keeps it to this share, so the hot queries keep their speed while "
        "it deletes (`100`: no rest).",
        _percent,
    )
    schedules_file: str | None = setting(
        "RECEIPT_SCHEDULES_FILE",
        None,
        "A TOML or JSON file of schedules, reconciled at startup by beat and the workers that run the "
        "schedules pass: declared ones are created or updated, ones removed from the file deleted; "
        "the same file twice changes nothing (`docs/schedules.md`).",
    )
    integration_publish_url: str | None = setting(
        "RECEIPT_INTEGRATION_PUBLISH_URL",
        None,
        "Where a `factory.integration.publish` job without a command POSTs the objective's task results.",
        url=True,
    )
    integration_publish_secret: str | None = setting(
        "RECEIPT_INTEGRATION_PUBLISH_SECRET",
        None,
        "Signs those POSTs (Standard Webhooks headers, HMAC-SHA256); `whsec_…` base64 or plain text.",
        secret=True,
    )
    objective_watchdog_test_tick_s: int | None = setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S",
        None,
        "Tests only: replaces the watchdog cron with a tick every N seconds (1..59, wall-clock aligned).",
        _int,
    )
    # -- processes
    process_role: str = setting(
        "RECEIPT_PROCESS_ROLE",
        "all",
        "`api`, `driver`, `worker-chat`, `worker-codex`, `worker-control`; anything else is `all`.",
    )
    execute_concurrency: int | None = setting(
        "RECEIPT_RESONATE_EXECUTE_CONCURRENCY",
        None,
        "Overrides every role's default concurrency.",
        _int,
    )
    worker_id: str | None = setting(
        "RECEIPT_WORKER_ID",
        None,
        "Worker identity written on leases, followed by the process's liveness epoch and a nonce per "
        "attempt. Unset: `<hostname>:<pid>`.",
    )
    worker_liveness_interval_ms: int = setting(
        "RECEIPT_WORKER_LIVENESS_INTERVAL_MS",
        "2000",
        "How often each worker process renews its own liveness record (apart from per-job heartbeats).",
        _int,
    )
    dispatch_lead: int = setting(
        "RECEIPT_DISPATCH_LEAD",
        "8",
        "Fair dispatch (docs/dispatch.md): a worker group's broker queue holds at most its live "
        "processes' free slots plus this many attempts per live process, but never more than that "
        "process's own slots; every other queued job waits in PostgreSQL, where each free place goes "
        "to the organisation with the fewest attempts in flight. A larger lead keeps busy workers fed "
        "across the claim's round trips (at 2, a no-op burst ran 30 % slower); a smaller one lets a "
        "new organisation's job start sooner. 0 to 64.",
        _dispatch_lead,
    )
    concurrency_limits: tuple[tuple[str, int], ...] = setting(
        "RECEIPT_CONCURRENCY_LIMITS",
        "",
        "Concurrency limits the operator declares per key prefix, e.g. `stripe=2,openai:=8`: at most "
        "that many attempts of one organisation whose `concurrencyKey` starts with the prefix run at "
        "once (each key on its own; the longest matching prefix wins, and overrides the job's own "
        "`concurrencyLimit`). A key with neither runs one at a time.",
        _concurrency_limits,
    )
    rate_limits: tuple[tuple[str, float], ...] = setting(
        "RECEIPT_RATE_LIMITS",
        "",
        "Rate limits per key prefix, e.g. `openai=20/s,mail:=300/min`: the attempts of one "
        "organisation's key that starts with the prefix are dispatched at most at that rate, across "
        "every process (a GCRA limiter in PostgreSQL, a burst of a tenth of a second).",
        _rate_limits,
    )
    redeliver_unfetched_ms: int = setting(
        "RECEIPT_REDELIVER_UNFETCHED_MS",
        "5000",
        "A worker (or driver) message sent this long ago that no process has fetched, while the queue "
        "it went to holds no message at all, is lost: its delivery ends `unfetched` and the job is "
        "sent again at once (fenced: a late original is inert). A message waiting in a queue with "
        "anything in it is never judged lost. 1000 to 60000.",
        _redeliver_ms,
    )
    lost_delivery_scan_interval_ms: int = setting(
        "RECEIPT_LOST_DELIVERY_SCAN_INTERVAL_MS",
        "1000",
        "Interval of the `lost-deliveries` loop, which sends again the jobs whose message is unfetched "
        "(`RECEIPT_REDELIVER_UNFETCHED_MS`) or died with the process that fetched it.",
        _at_least_one,
    )
    worker_liveness_scan_interval_ms: int = setting(
        "RECEIPT_WORKER_LIVENESS_SCAN_INTERVAL_MS",
        "2000",
        "Interval of the `worker-liveness` loop that looks for lapsed worker processes: a dead one's "
        "jobs run again within `RECEIPT_WORKER_DEAD_AFTER_MS` plus this.",
        _int,
    )
    worker_self_fence_ms: int = setting(
        "RECEIPT_WORKER_SELF_FENCE_MS",
        "6000",
        "A worker that could not renew its liveness for this long cancels its attempts and kills their "
        "commands, then takes a new identity. At least 2 renewal intervals.",
        _int,
    )
    worker_dead_after_ms: int = setting(
        "RECEIPT_WORKER_DEAD_AFTER_MS",
        "10000",
        "A worker whose liveness lapsed this long is dead: its jobs get `job.lease_expired` at once and are "
        "redelivered. At least `RECEIPT_WORKER_SELF_FENCE_MS` + 2000 (checked at start).",
        _int,
    )
    startup_wait_s: int = setting(
        "RECEIPT_STARTUP_WAIT_S",
        "60",
        "How long a starting process (web, workers, beat, Flower) waits for a database or broker that "
        "refuses or does not answer, trying again with a doubling backoff (1 s up to 10 s) and one "
        "line per try; then it exits 2 with the problem. A malformed URL, an unknown scheme, a host "
        "that does not resolve or refused credentials fail at once. `0` fails at once; at most 3600.",
        _startup_wait_s,
    )
    shutdown_grace_ms: int = setting(
        "RECEIPT_SHUTDOWN_GRACE_MS",
        "20000",
        "From SIGTERM to exit, for every worker, the driver and the web process: running attempts "
        "may finish for its first three quarters (at most grace - 1 s), then are cancelled and handed "
        "back uncharged (`job.released`). Set it a few seconds under the platform's kill timeout "
        "(Heroku, Render: 30 s; Fly: 5 s unless `kill_timeout` is raised, so 4000 there).",
        _int,
    )
    # -- callbacks
    callback_url: str | None = setting(
        "RECEIPT_RESONATE_CALLBACK_URL",
        None,
        "Receives a JSON POST on dispatched/completed/failed/canceled.",
        url=True,
    )
    event_callback_url: str | None = setting(
        "RECEIPT_EVENT_CALLBACK_URL",
        None,
        "A second callback target, same payload.",
        url=True,
    )
    callback_token: str | None = setting(
        "RECEIPT_CALLBACK_TOKEN",
        None,
        "Sent as `Authorization: Bearer` on callbacks when set.",
        secret=True,
    )
    callback_secret: str | None = setting(
        "RECEIPT_CALLBACK_SECRET",
        None,
        "Signs every callback (Standard Webhooks: `webhook-id`, `webhook-timestamp`, "
        "`webhook-signature`, HMAC-SHA256). `whsec_<base64>` is decoded as the standard says; any "
        "other value is used as raw UTF-8 bytes. Unset: callbacks go unsigned (logged at start).",
        secret=True,
    )
    callback_send_interval_ms: int = setting(
        "RECEIPT_CALLBACK_SEND_INTERVAL_MS",
        "500",
        "Interval of the callback sender loop (delivers the callback outbox).",
        _int,
    )
    callback_retry_base_ms: int = setting(
        "RECEIPT_CALLBACK_RETRY_BASE_MS",
        "1000",
        "Wait after a callback's first failed attempt; doubles each attempt.",
        _int,
    )
    callback_retry_max_ms: int = setting(
        "RECEIPT_CALLBACK_RETRY_MAX_MS",
        "3600000",
        "Cap of the wait between two attempts of one callback.",
        _int,
    )
    callback_give_up_ms: int = setting(
        "RECEIPT_CALLBACK_GIVE_UP_MS",
        "86400000",
        "A callback still failing this long after its event is dead-lettered (`receipt callbacks "
        "--state dead`).",
        _int,
    )
    # -- handlers
    codex_commands: bool = setting(
        "RECEIPT_CODEX_COMMANDS",
        "disabled",
        "`enabled` lets the codex handler run `factory.task.run` commands (argv, never a shell).",
        switch,
    )
    celery_events: bool = setting(
        "RECEIPT_CELERY_EVENTS",
        "disabled",
        "`enabled` makes workers send task events from start (Flower turns them on by itself while it runs).",
        switch,
    )
    handler_modules: str = setting(
        "RECEIPT_HANDLER_MODULES",
        "",
        "Comma-separated modules, each with `register(registry)`, adding agent handlers to every worker.",
    )
    planner_module: str = setting(
        "RECEIPT_PLANNER_MODULE",
        "app.factory.planner",
        "Module whose `make_planner(settings)` turns a `factory.run` goal into a plan. The built-in "
        "one accepts only a goal that carries an explicit plan.",
    )
    codex_output_tail_bytes: int = setting(
        "RECEIPT_CODEX_OUTPUT_TAIL_BYTES",
        "4096",
        "How much of a command's output the codex handler keeps in `result` and failures.",
        _int,
    )
    # -- security: the command sandbox, and bounds per tenant. See docs/security.md.
    codex_uid_range: str = setting(
        "RECEIPT_CODEX_UID_RANGE",
        "1879048192-1879052287",
        "`FIRST-LAST`: a root worker runs each attempt as a user id of this range that no other running "
        "attempt holds (no user, group or subordinate range of the host may lie in it); "
        "`none`: every command runs as `RECEIPT_CODEX_USER`.",
    )
    codex_user: str = setting(
        "RECEIPT_CODEX_USER",
        "nobody",
        "User every command runs as when the worker is root and `RECEIPT_CODEX_UID_RANGE=none` "
        "(never root itself).",
    )
    codex_filesystem: str = setting(
        "RECEIPT_CODEX_FILESYSTEM",
        "private",
        "`private`: each command sees only `RECEIPT_CODEX_VISIBLE_PATHS` (read-only), its scratch "
        "directory, the workspace root and a private `/tmp`; `host`: the host's whole filesystem.",
    )
    codex_visible_paths: str = setting(
        "RECEIPT_CODEX_VISIBLE_PATHS",
        "/usr,/bin,/sbin,/lib,/lib32,/lib64,/libx32,/etc,/opt,/sys",
        "Comma-separated host trees a command sees read-only in its private view. A unix socket inside "
        "one stays reachable (read-only does not stop `connect`): list no tree that holds one.",
    )
    codex_tmpfs_mb: int = setting(
        "RECEIPT_CODEX_TMPFS_MB",
        "64",
        "Size of each private in-memory folder of a command's view (`/tmp`, `/var/tmp`, `/dev/shm`), in MiB.",
        _int,
    )
    codex_network: str = setting(
        "RECEIPT_CODEX_NETWORK",
        "none",
        "`none`: each command gets its own network namespace with no interface up; `host`: the "
        "worker's network.",
    )
    codex_memory_mb: int = setting(
        "RECEIPT_CODEX_MEMORY_MB",
        "1024",
        "Address-space limit of each command process (RLIMIT_AS), in MiB.",
        _int,
    )
    codex_cpu_seconds: int = setting(
        "RECEIPT_CODEX_CPU_SECONDS",
        "3600",
        "CPU-time limit of each command process (RLIMIT_CPU), in seconds.",
        _int,
    )
    codex_max_processes: int = setting(
        "RECEIPT_CODEX_MAX_PROCESSES",
        "256",
        "Process limit of each command (RLIMIT_NPROC, counted per command: each runs in a user namespace "
        "of its own). Not applied when the worker is not root.",
        _int,
    )
    codex_max_file_mb: int = setting(
        "RECEIPT_CODEX_MAX_FILE_MB",
        "1024",
        "Largest file a command may write (RLIMIT_FSIZE), in MiB.",
        _int,
    )
    codex_max_open_files: int = setting(
        "RECEIPT_CODEX_MAX_OPEN_FILES",
        "1024",
        "Open-file limit of each command process (RLIMIT_NOFILE).",
        _int,
    )
    codex_workspace_root: str | None = setting(
        "RECEIPT_CODEX_WORKSPACE_ROOT",
        None,
        "A payload `cwd` must resolve inside this folder. Unset: only inside the attempt's scratch "
        "directory.",
    )
    codex_scratch_root: str | None = setting(
        "RECEIPT_CODEX_SCRATCH_ROOT",
        None,
        "Where each attempt's scratch directory is made (and removed afterwards). Unset: the system "
        "temp folder.",
    )
    max_commands_per_job: int = setting(
        "RECEIPT_MAX_COMMANDS_PER_JOB",
        "1000",
        "Queue commands one job may hold (steer, follow_up, abort); past it: 409 `too_many_commands`.",
        _int,
    )
    group_commit_max: int = setting(
        "RECEIPT_GROUP_COMMIT_MAX",
        "64",
        "Worker and driver processes: job transitions (heartbeats, progress, settlements) that arrive "
        "while another commits share the next commit, this many at most; one arriving alone commits "
        "at once. `1` commits each alone.",
        _int,
    )
    refill_coalesce_ms: int = setting(
        "RECEIPT_REFILL_COALESCE_MS",
        "20",
        "How long a worker process's refill lets the places its ended attempts free gather before it "
        "runs the pass that fills them: one pass for several places costs the round trips of one (at "
        "20 ms, 5.5 -> 4.6 statements a job under load), and the lead's messages "
        "(`RECEIPT_DISPATCH_LEAD`) keep its slots fed meanwhile. A new job's own dispatch never waits "
        "for it. `0` runs a pass as soon as a place frees. At most 1000.",
        _refill_coalesce_ms,
    )
    delivery_batch_max: int = setting(
        "RECEIPT_DELIVERY_BATCH_MAX",
        "8",
        "Driver scans: worker messages bound for one worker queue leave as one `receipt.execute_batch` "
        "message of up to this many attempts, each under its own fence; the worker leases as many as "
        "it has free slots for in one commit and runs them within its concurrency. `1` sends one "
        "`receipt.execute` per attempt.",
        _at_least_one,
    )
    worker_wakes: bool = setting(
        "RECEIPT_WORKER_WAKES",
        "enabled",
        "`enabled`: each worker process with more than one slot takes the wake-ups of the worker "
        "queues it consumes (a Redis list per queue), runs the dispatch scan itself, and runs the "
        "attempts it claims on its own free slots with no worker message (always leaving one slot free "
        "for a message already waiting); the rest leave as messages. The driver takes the wake-ups of "
        "every queue no worker listens to. `disabled`: only driver processes take wake-ups, and every "
        'attempt travels as a worker message (docs/dispatch.md, "Worker processes take the wake-ups of '
        'their own queues").',
        switch,
    )
    delivery_local: bool = setting(
        "RECEIPT_DELIVERY_LOCAL",
        "disabled",
        "`enabled`: a worker process runs the attempts its own dispatch pass (the refill of the places "
        "its ended attempts freed) claims for its free slots itself, without a broker message, "
        "recorded as fetched by it, always leaving one slot free for a message already waiting; the "
        "rest leave as messages. Off by default: another organisation's job behind a burst waits "
        'longer, and the CPU it saves was within the benches\' noise (docs/design.md, "Local runs").',
        switch,
    )
    delivery_hold_ms: int = setting(
        "RECEIPT_DELIVERY_HOLD_MS",
        "500",
        "How long attempts a worker process fetched (a message's one, or a batch's not yet leased) "
        "wait for one of its slots when every slot is busy, before it hands them back to their queue "
        "in one message for a process with a free slot to take (a failed hand-back keeps them waiting "
        "here, as does the embedded folder broker, whose consumer would fetch them straight back). "
        "Short jobs free slots well within it; long ones (codex) do not. `0` hands back at once; at "
        "most 60000.",
        _hold_ms,
    )
    batch_max: int = setting(
        "RECEIPT_BATCH_MAX",
        "1000",
        "Jobs one `POST /jobs:batch` may carry (each counts as one write against the write limit).",
        _int,
    )
    max_page_bytes: int = setting(
        "RECEIPT_MAX_PAGE_BYTES",
        "1048576",
        "Largest JSON page `GET /jobs` or a receipts page returns; a page cut short returns its cursor.",
        _int,
    )
    sse_max_streams_per_token: int = setting(
        "RECEIPT_SSE_MAX_STREAMS_PER_TOKEN",
        "10",
        "Event streams one token may hold open in one API process; past it: 429 with Retry-After.",
        _int,
    )
    sse_max_streams_per_process: int = setting(
        "RECEIPT_SSE_MAX_STREAMS_PER_PROCESS",
        "200",
        "Event streams one API process holds open in all; past it: 429 with Retry-After.",
        _int,
    )
    rate_limit_writes: str = setting(
        "RECEIPT_RATE_LIMIT_WRITES",
        "20000/minute",
        "Writes (POST) one organisation may make per route, as a `limits` rate "
        "(`20000/minute;500/second`); `disabled` turns it off. Counted in Redis (REDIS_URL); embedded "
        "mode counts in memory.",
    )
    org_weights: tuple[tuple[str, float], ...] = setting(
        "RECEIPT_ORG_WEIGHTS",
        "",
        "Each organisation's weight in the fair share of a worker group's free slots: `org=weight` "
        "pairs, comma-separated (`org-a=3,org-b=0.5`; above 0, at most 100). An organisation not "
        "listed weighs 1. `PUT /organizations/{id}/dispatch` overrides it (docs/dispatch.md).",
        _org_weights,
    )
    org_rate_limits: tuple[tuple[str, float], ...] = setting(
        "RECEIPT_ORG_RATE_LIMITS",
        "",
        "The most dispatches an organisation gets, across every process: `org=N/s`, `N/min` or `N/h`, "
        "comma-separated (`org-a=20/s,org-b=300/min`; at most 100000/s). An organisation not listed "
        "has no limit. `PUT /organizations/{id}/dispatch` overrides it (docs/dispatch.md).",
        _org_rates,
    )
    # -- observability (logs, metrics)
    log_format: str = setting(
        "RECEIPT_LOG_FORMAT",
        "plain",
        "`plain` (one readable line per record) or `json` (one JSON object per line, with `jobId`, "
        "`attempt`, `fence`, `workerId`, `role` and `org` on job-related lines). Web, workers and "
        "beat.",
        _log_format,
    )
    trace_url_template: str | None = setting(
        "RECEIPT_TRACE_URL_TEMPLATE",
        None,
        "The dashboard's job page links to the job's trace: this URL with `{traceId}` replaced by "
        "the trace id its enqueue recorded (Jaeger: `http://jaeger:16686/trace/{traceId}`). Unset: no "
        "link. Tracing itself is set by the `OTEL_*` variables (docs/tracing.md).",
        _trace_url_template,
    )
    log_level: str = setting(
        "RECEIPT_LOG_LEVEL",
        "INFO",
        "Root log level of every process (`DEBUG`, `INFO`, ...).",
    )
    log_ticks: bool = setting(
        "RECEIPT_LOG_TICKS",
        "disabled",
        "`enabled` logs what happens on every tick at the root level too: each recovery loop's pass, "
        "beat's every send and Celery's received/succeeded line per task. Off, they are at `DEBUG`, so "
        "an idle process stays quiet; `receipt_loop_passes_total` and the loop gauges count them.",
        switch,
    )
    access_log: bool = setting(
        "RECEIPT_ACCESS_LOG",
        "disabled",
        "`enabled` writes gunicorn's access line for every HTTP request the web process answers. Off, "
        "each request is counted in `receipt_http_requests_total` (method, route, status) instead, "
        "and a platform's router still logs every request it forwards.",
        switch,
    )
    metrics_token: str | None = setting(
        "RECEIPT_METRICS_TOKEN",
        None,
        "A bearer secret that may read `/metrics` (for a Prometheus scraper). Unset: only system "
        "tokens may. Organisation tokens never may (metrics span every organisation).",
        secret=True,
    )
    worker_metrics_port: int | None = setting(
        "RECEIPT_WORKER_METRICS_PORT",
        None,
        "When set, each worker process (driver, worker groups) serves its own counters at "
        "`:PORT/metrics` (all interfaces), for hosts whose web process cannot read them. Needs "
        "`RECEIPT_METRICS_TOKEN`, which the scraper sends as its bearer token.",
        _int,
    )

    def __post_init__(self) -> None:
        for s in _SWITCHES:
            value = getattr(self, s.attr)
            if isinstance(value, str):
                try:
                    object.__setattr__(self, s.attr, switch(value))
                except ValueError as exc:
                    raise ValueError(f"{s.attr}: cannot parse {value!r} ({exc})") from None
            elif not isinstance(value, bool):
                raise TypeError(f"{s.attr} is on/off: pass True or False, not {value!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Read every declared variable; an unparsable value names the variable (never a secret)."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in declared(cls):
            raw = source.get(s.env)
            if raw is None or raw.strip() == "":
                raw = s.default
            if raw is None:
                values[s.attr] = None
                continue
            try:
                values[s.attr] = s.parse(raw)
            except ValueError as exc:
                if s.secret or s.url:  # the parser's message may quote the value
                    raise ValueError(f"{s.env}: cannot parse its value (a secret: not shown)") from None
                raise ValueError(f"{s.env}: cannot parse {raw!r} ({exc})") from None
        return cls(**values)

    # -- derived values -------------------------------------------------------------
    @property
    def home_path(self) -> Path:
        return Path(self.home).expanduser().resolve()

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL SQLAlchemy should open (embedded SQLite when DATABASE_URL is unset)."""
        if self.database_url:
            return normalise_database_url(self.database_url)
        return f"sqlite:///{self.home_path / 'receipt.db'}"

    @property
    def archive_path(self) -> Path:
        """Where archived segments go: ``RECEIPT_ARCHIVE_DIR`` or ``$RECEIPT_HOME/archive``."""
        if self.archive_dir:
            return Path(self.archive_dir).expanduser().resolve()
        return self.home_path / "archive"

    @property
    def retention_enabled(self) -> bool:
        """Whether any organisation's history ever leaves the database."""
        return self.retention_days > 0 or any(days > 0 for _, days in self.retention_days_by_organization)

    @property
    def embedded(self) -> bool:
        return not self.database_url

    @property
    def callback_targets(self) -> tuple[str, ...]:
        """Where callback events go (spec step 6): both URLs when set, each once."""
        return tuple(dict.fromkeys(u for u in (self.callback_url, self.event_callback_url) if u))

    @property
    def auth_disabled(self) -> bool:
        return not self.auth


_DECLARED: dict[type[Settings], tuple[Setting, ...]] = {}


def declared(cls: type[Settings] = Settings) -> tuple[Setting, ...]:
    """The declaration of every field of ``cls`` (a subclass adds its own), in declaration order."""
    found = _DECLARED.get(cls)
    if found is None:
        found = _DECLARED[cls] = tuple(_declaration(f) for f in fields(cls))
    return found


def _declaration(f: Field[Any]) -> Setting:
    found = f.metadata.get(DECLARATION)
    if not isinstance(found, Setting):
        raise TypeError(f"Settings.{f.name} is not declared with setting(...)")
    return Setting(found.env, found.default, found.doc, found.parse, found.secret, found.url, f.name)


SETTINGS: Final[tuple[Setting, ...]] = declared(Settings)
_SWITCHES: Final = tuple(s for s in SETTINGS if s.parse is switch)


def normalise_database_url(url: str) -> str:
    """PaaS add-ons hand out ``postgres://``; SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3.

    Receipt ships psycopg2, so both spellings are pinned to ``postgresql+psycopg2://``.
    """
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


# -- redaction: follows the marks above ----------------------------------------------------


def mask_url(url: str) -> str:
    """``url`` with its password (and any query string, where tokens ride) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK  # not a URL that can be taken apart: where its secret is cannot be told
    if "@" not in parts.netloc and not parts.query:
        return url  # nothing secret; and urlunsplit would not round-trip sqlite:////path
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = MASK if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redacted(settings: Settings) -> dict[str, Any]:
    """The settings as they may be shown (``receipt config``, the system page): secrets as ``***``."""
    return {s.attr: s.shown(getattr(settings, s.attr)) for s in declared(type(settings))}


def settings_markdown_table() -> str:
    """The README's configuration table, generated from the declarations."""
    rows = ["| variable | default | what it bounds |", "|---|---|---|"]
    for s in SETTINGS:
        default = "(unset)" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.env}` | {default} | {s.doc}{_shown_note(s)} |")
    return "\n".join(rows)


def _shown_note(s: Setting) -> str:
    if s.secret:
        return " Secret: shown as `***`."
    if s.url:
        return " Its password and query string are shown as `***`."
    return ""
