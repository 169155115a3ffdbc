"""The one configuration object: every environment variable Receipt reads, with its default.

The README's configuration table is generated from ``SETTINGS`` (``receipt config --markdown``)
and a test checks that the table in the README matches it, so the two cannot drift.
Spec floors, clamps and caps are *not* applied here: they are rules, and they live with the
rule that needs them (``app/timing.py``), each in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default (as text, ``None`` for unset) and purpose."""

    env: str
    attr: str
    default: str | None
    doc: str
    parse: Callable[[str], Any] = str


def _int(text: str) -> int:
    return int(text.strip())


def _enabled(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("enabled", "disabled"):
        raise ValueError("allowed values: enabled, disabled")
    return value == "enabled"


def _log_format(text: str) -> str:
    value = text.strip().lower()
    if value not in ("plain", "json"):
        raise ValueError("allowed values: plain, json")
    return value


SETTINGS: tuple[Setting, ...] = (
    # -- storage and broker
    Setting(
        "DATABASE_URL",
        "database_url",
        None,
        "Database URL. Unset: the embedded SQLite file `$RECEIPT_HOME/receipt.db`. "
        "`postgres://` and `postgresql://` are normalised to the psycopg2 driver.",
    ),
    Setting(
        "RECEIPT_DB_PREPARED_STATEMENTS",
        "db_prepared_statements",
        "disabled",
        "`enabled` prepares each hot statement once per PostgreSQL connection (server-side `PREPARE`): "
        "less database CPU per job. Keep `disabled` behind a transaction-mode pooler (PgBouncer "
        "`pool_mode=transaction`), where prepared statements do not follow a client's connection.",
        _enabled,
    ),
    Setting(
        "REDIS_URL",
        "redis_url",
        None,
        "Celery broker URL (Redis in production). Unset: the embedded filesystem broker under "
        "`$RECEIPT_HOME/broker`.",
    ),
    Setting(
        "RECEIPT_HOME",
        "home",
        "./.receipt",
        "Folder for the embedded default's database file, broker folders and logs.",
    ),
    # -- API
    Setting(
        "RECEIPT_AUTH",
        "auth",
        "enabled",
        "`enabled` (Bearer tokens on every endpoint but /healthz) or `disabled` (anonymous; warns on "
        "every response).",
    ),
    Setting(
        "RECEIPT_MAX_BODY_BYTES",
        "max_body_bytes",
        "1048576",
        "Largest request body the API accepts; larger gets 413.",
        _int,
    ),
    Setting(
        "RECEIPT_SSE_POLL_MS",
        "sse_poll_ms",
        "250",
        "How often the API process's one event-stream poller asks which open streams advanced "
        "(one query for all of them).",
        _int,
    ),
    Setting(
        "RECEIPT_SSE_MAX_SECONDS",
        "sse_max_seconds",
        "300",
        "Longest an event stream stays open before the server ends it (the client resumes with "
        "Last-Event-ID).",
        _int,
    ),
    # -- leases and timeouts (spec: "Leases, timeouts and heartbeats")
    Setting("JOB_LEASE_MS", "job_lease_ms", "300000", "Default job lease.", _int),
    Setting(
        "FACTORY_CONTROL_JOB_LEASE_MS",
        "factory_control_job_lease_ms",
        "900000",
        "Lease for `factory-control` running `factory.objective.control` (the larger of this and "
        "JOB_LEASE_MS).",
        _int,
    ),
    Setting(
        "FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS",
        "factory_control_job_execution_timeout_ms",
        None,
        "May lower the execution timeout of objective control jobs only.",
        _int,
    ),
    Setting(
        "CODEX_JOB_LEASE_MS",
        "codex_job_lease_ms",
        "900000",
        "Lease for `codex` jobs and computer-path `factory.task.monitor` jobs.",
        _int,
    ),
    Setting(
        "RECEIPT_RESONATE_ACTIVE_STALE_MS",
        "active_stale_ms",
        "600000",
        "Heartbeat cadence is a third of the smaller of the lease and this.",
        _int,
    ),
    Setting(
        "RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS",
        "heartbeat_interval_ms",
        None,
        "Can only lower the derived heartbeat cadence, never raise it.",
        _int,
    ),
    # -- recovery loops
    Setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS",
        "queued_redrive_interval_ms",
        "15000",
        "Interval of the queued-job redrive loop.",
        _int,
    ),
    Setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_STARTUP_DELAY_MS",
        "queued_redrive_startup_delay_ms",
        "5000",
        "Delay before the first redrive pass after start.",
        _int,
    ),
    Setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS",
        "queued_redrive_min_age_ms",
        "30000",
        "A queued job younger than this is left to its own dispatch.",
        _int,
    ),
    Setting(
        "RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS",
        "queued_redrive_cooldown_ms",
        "15000",
        "Least time between two redrives of the same job.",
        _int,
    ),
    Setting(
        "RECEIPT_LEASE_EXPIRY_INTERVAL_MS",
        "lease_expiry_interval_ms",
        "5000",
        "Interval of the lease-expiry loop (appends `job.lease_expired` for leases past their deadline).",
        _int,
    ),
    Setting(
        "RECEIPT_RETRY_BACKOFF_MS",
        "retry_backoff_ms",
        "1000",
        "Delay before the first retry of a retryable failure; doubles each attempt. `0` retries at once.",
        _int,
    ),
    Setting("RECEIPT_RETRY_BACKOFF_MAX_MS", "retry_backoff_max_ms", "60000", "Cap of the retry delay.", _int),
    Setting(
        "RECEIPT_RETRY_SCAN_INTERVAL_MS",
        "retry_scan_interval_ms",
        "1000",
        "Interval of the loop that dispatches retries whose delay has passed.",
        _int,
    ),
    Setting(
        "RESONATE_STARTUP_SETTLE_MS",
        "startup_settle_ms",
        "1000",
        "Settle time before objective resume runs at startup (every process role, once, single-flight).",
        _int,
    ),
    Setting(
        "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS",
        "objective_control_outbox_redrive_interval_ms",
        "5000",
        "Interval of the objective-control outbox redrive (celery beat; runs on `worker-control` and `all`).",
        _int,
    ),
    Setting(
        "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS",
        "objective_control_outbox_redrive_timeout_ms",
        "15000",
        "Observational deadline of one outbox redrive pass: a slower pass keeps running and logs "
        "`factory.control_outbox_redrive_slow`.",
        _int,
    ),
    Setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON",
        "objective_watchdog_cron",
        "* * * * *",
        "Cron schedule of the objective watchdog (celery beat; standard 5 fields; an invalid expression "
        "stops beat at start). Each tick enqueues one `factory.objective.watchdog` job on `factory-control`.",
    ),
    Setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED",
        "objective_watchdog_enabled",
        "1",
        "`0` turns the objective watchdog off (beat schedules no tick).",
    ),
    Setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS",
        "objective_watchdog_timeout_ms",
        "60000",
        "Deadline of one watchdog pass (floor 10 000 ms): paging stops there and the result says `timedOut`.",
        _int,
    ),
    Setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT",
        "objective_watchdog_scan_limit",
        "200",
        "Active objectives the watchdog reads per page, oldest first (clamped to 1..2000).",
        _int,
    ),
    Setting(
        "RECEIPT_INTEGRATION_PUBLISH_URL",
        "integration_publish_url",
        None,
        "Where a `factory.integration.publish` job without a command POSTs the objective's task results.",
    ),
    Setting(
        "RECEIPT_INTEGRATION_PUBLISH_SECRET",
        "integration_publish_secret",
        None,
        "Signs those POSTs (Standard Webhooks headers, HMAC-SHA256); `whsec_…` base64 or plain text.",
    ),
    Setting(
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S",
        "objective_watchdog_test_tick_s",
        None,
        "Tests only: replaces the watchdog cron with a tick every N seconds (1..59, wall-clock aligned).",
        _int,
    ),
    # -- processes
    Setting(
        "RECEIPT_PROCESS_ROLE",
        "process_role",
        "all",
        "`api`, `driver`, `worker-chat`, `worker-codex`, `worker-control`; anything else is `all`.",
    ),
    Setting(
        "RECEIPT_RESONATE_EXECUTE_CONCURRENCY",
        "execute_concurrency",
        None,
        "Overrides every role's default concurrency.",
        _int,
    ),
    Setting(
        "RECEIPT_WORKER_ID",
        "worker_id",
        None,
        "Worker identity written on leases. Unset: `<hostname>:<pid>`.",
    ),
    # -- callbacks
    Setting(
        "RECEIPT_RESONATE_CALLBACK_URL",
        "callback_url",
        None,
        "Receives a JSON POST on dispatched/completed/failed/canceled.",
    ),
    Setting(
        "RECEIPT_EVENT_CALLBACK_URL", "event_callback_url", None, "A second callback target, same payload."
    ),
    Setting(
        "RECEIPT_CALLBACK_TOKEN",
        "callback_token",
        None,
        "Sent as `Authorization: Bearer` on callbacks when set.",
    ),
    Setting(
        "RECEIPT_CALLBACK_SECRET",
        "callback_secret",
        None,
        "Signs every callback (Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`, "
        "HMAC-SHA256). `whsec_<base64>` is decoded as the standard says; any other value is used as raw "
        "UTF-8 bytes. Unset: callbacks go unsigned (logged at start).",
    ),
    Setting(
        "RECEIPT_CALLBACK_SEND_INTERVAL_MS",
        "callback_send_interval_ms",
        "500",
        "Interval of the callback sender loop (delivers the callback outbox).",
        _int,
    ),
    Setting(
        "RECEIPT_CALLBACK_RETRY_BASE_MS",
        "callback_retry_base_ms",
        "1000",
        "Wait after a callback's first failed attempt; doubles each attempt.",
        _int,
    ),
    Setting(
        "RECEIPT_CALLBACK_RETRY_MAX_MS",
        "callback_retry_max_ms",
        "3600000",
        "Cap of the wait between two attempts of one callback.",
        _int,
    ),
    Setting(
        "RECEIPT_CALLBACK_GIVE_UP_MS",
        "callback_give_up_ms",
        "86400000",
        "A callback still failing this long after its event is dead-lettered "
        "(`receipt callbacks --state dead`).",
        _int,
    ),
    # -- handlers
    Setting(
        "RECEIPT_CODEX_COMMANDS",
        "codex_commands",
        "disabled",
        "`enabled` lets the codex handler run `factory.task.run` commands (argv, never a shell).",
    ),
    Setting(
        "RECEIPT_CELERY_EVENTS",
        "celery_events",
        "disabled",
        "`enabled` makes workers send task events from start (Flower turns them on by itself while it runs).",
    ),
    Setting(
        "RECEIPT_HANDLER_MODULES",
        "handler_modules",
        "",
        "Comma-separated modules, each with `register(registry)`, adding agent handlers to every worker.",
    ),
    Setting(
        "RECEIPT_PLANNER_MODULE",
        "planner_module",
        "app.factory.planner",
        "Module whose `make_planner(settings)` turns a `factory.run` goal into a plan. The built-in one "
        "accepts only a goal that carries an explicit plan.",
    ),
    Setting(
        "RECEIPT_CODEX_OUTPUT_TAIL_BYTES",
        "codex_output_tail_bytes",
        "4096",
        "How much of a command's output the codex handler keeps in `result` and failures.",
        _int,
    ),
    # -- security: the command sandbox, and bounds per tenant. See docs/security.md.
    Setting(
        "RECEIPT_CODEX_UID_RANGE",
        "codex_uid_range",
        "1879048192-1879052287",
        "`FIRST-LAST`: a root worker runs each attempt as a user id of this range that no other running "
        "attempt holds (no user, group or subordinate range of the host may lie in it); "
        "`none`: every command runs as `RECEIPT_CODEX_USER`.",
    ),
    Setting(
        "RECEIPT_CODEX_USER",
        "codex_user",
        "nobody",
        "User every command runs as when the worker is root and `RECEIPT_CODEX_UID_RANGE=none` "
        "(never root itself).",
    ),
    Setting(
        "RECEIPT_CODEX_FILESYSTEM",
        "codex_filesystem",
        "private",
        "`private`: each command sees only `RECEIPT_CODEX_VISIBLE_PATHS` (read-only), its scratch "
        "directory, the workspace root and a private `/tmp`; `host`: the host's whole filesystem.",
    ),
    Setting(
        "RECEIPT_CODEX_VISIBLE_PATHS",
        "codex_visible_paths",
        "/usr,/bin,/sbin,/lib,/lib32,/lib64,/libx32,/etc,/opt,/sys",
        "Comma-separated host trees a command sees read-only in its private view. A unix socket inside "
        "one stays reachable (read-only does not stop `connect`): list no tree that holds one.",
    ),
    Setting(
        "RECEIPT_CODEX_TMPFS_MB",
        "codex_tmpfs_mb",
        "64",
        "Size of each private in-memory folder of a command's view (`/tmp`, `/var/tmp`, `/dev/shm`), in MiB.",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_NETWORK",
        "codex_network",
        "none",
        "`none`: each command gets its own network namespace with no interface up; "
        "`host`: the worker's network.",
    ),
    Setting(
        "RECEIPT_CODEX_MEMORY_MB",
        "codex_memory_mb",
        "1024",
        "Address-space limit of each command process (RLIMIT_AS), in MiB.",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_CPU_SECONDS",
        "codex_cpu_seconds",
        "3600",
        "CPU-time limit of each command process (RLIMIT_CPU), in seconds.",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_MAX_PROCESSES",
        "codex_max_processes",
        "256",
        "Process limit of each command (RLIMIT_NPROC, counted per command: each runs in a user namespace "
        "of its own). Not applied when the worker is not root.",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_MAX_FILE_MB",
        "codex_max_file_mb",
        "1024",
        "Largest file a command may write (RLIMIT_FSIZE), in MiB.",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_MAX_OPEN_FILES",
        "codex_max_open_files",
        "1024",
        "Open-file limit of each command process (RLIMIT_NOFILE).",
        _int,
    ),
    Setting(
        "RECEIPT_CODEX_WORKSPACE_ROOT",
        "codex_workspace_root",
        None,
        "A payload `cwd` must resolve inside this folder. "
        "Unset: only inside the attempt's scratch directory.",
    ),
    Setting(
        "RECEIPT_CODEX_SCRATCH_ROOT",
        "codex_scratch_root",
        None,
        "Where each attempt's scratch directory is made (and removed afterwards). "
        "Unset: the system temp folder.",
    ),
    Setting(
        "RECEIPT_MAX_COMMANDS_PER_JOB",
        "max_commands_per_job",
        "1000",
        "Queue commands one job may hold (steer, follow_up, abort); past it: 409 `too_many_commands`.",
        _int,
    ),
    Setting(
        "RECEIPT_MAX_PAGE_BYTES",
        "max_page_bytes",
        "1048576",
        "Largest JSON page `GET /jobs` or a receipts page returns; a page cut short returns its cursor.",
        _int,
    ),
    Setting(
        "RECEIPT_SSE_MAX_STREAMS_PER_TOKEN",
        "sse_max_streams_per_token",
        "10",
        "Event streams one token may hold open in one API process; past it: 429 with Retry-After.",
        _int,
    ),
    Setting(
        "RECEIPT_SSE_MAX_STREAMS_PER_PROCESS",
        "sse_max_streams_per_process",
        "200",
        "Event streams one API process holds open in all; past it: 429 with Retry-After.",
        _int,
    ),
    Setting(
        "RECEIPT_RATE_LIMIT_WRITES",
        "rate_limit_writes",
        "600/minute",
        "Writes (POST) one organisation may make per route, as a `limits` rate (`600/minute;50/second`); "
        "`disabled` turns it off. Counted in Redis (REDIS_URL); embedded mode counts in memory.",
    ),
    # -- observability (logs, metrics)
    Setting(
        "RECEIPT_LOG_FORMAT",
        "log_format",
        "plain",
        "`plain` (one readable line per record) or `json` (one JSON object per line, with `jobId`, "
        "`attempt`, `fence`, `workerId`, `role` and `org` on job-related lines). Web, workers and beat.",
        _log_format,
    ),
    Setting(
        "RECEIPT_LOG_LEVEL", "log_level", "INFO", "Root log level of every process (`DEBUG`, `INFO`, ...)."
    ),
    Setting(
        "RECEIPT_METRICS_TOKEN",
        "metrics_token",
        None,
        "A bearer secret that may read `/metrics` (for a Prometheus scraper). Unset: only system "
        "tokens may. Organisation tokens never may (metrics span every organisation).",
    ),
    Setting(
        "RECEIPT_WORKER_METRICS_PORT",
        "worker_metrics_port",
        None,
        "When set, each worker process (driver, worker groups) serves its own counters at "
        "`:PORT/metrics` (all interfaces), for hosts whose web process cannot read them. Needs "
        "`RECEIPT_METRICS_TOKEN`, which the scraper sends as its bearer token.",
        _int,
    ),
)


@dataclass(frozen=True)
class Settings:
    """Parsed settings. Build with ``Settings.from_env``; pass it in, never read os.environ deeper down."""

    database_url: str | None = None
    redis_url: str | None = None
    home: str = "./.receipt"
    auth: str = "enabled"
    max_body_bytes: int = 1048576
    sse_poll_ms: int = 250
    sse_max_seconds: int = 300
    job_lease_ms: int = 300000
    factory_control_job_lease_ms: int = 900000
    factory_control_job_execution_timeout_ms: int | None = None
    codex_job_lease_ms: int = 900000
    active_stale_ms: int = 600000
    heartbeat_interval_ms: int | None = None
    queued_redrive_interval_ms: int = 15000
    queued_redrive_startup_delay_ms: int = 5000
    queued_redrive_min_age_ms: int = 30000
    queued_redrive_cooldown_ms: int = 15000
    lease_expiry_interval_ms: int = 5000
    retry_backoff_ms: int = 1000
    retry_backoff_max_ms: int = 60000
    retry_scan_interval_ms: int = 1000
    startup_settle_ms: int = 1000
    objective_control_outbox_redrive_interval_ms: int = 5000
    objective_control_outbox_redrive_timeout_ms: int = 15000
    objective_watchdog_cron: str = "* * * * *"
    objective_watchdog_enabled: str = "1"
    objective_watchdog_timeout_ms: int = 60000
    objective_watchdog_scan_limit: int = 200
    objective_watchdog_test_tick_s: int | None = None
    integration_publish_url: str | None = None
    integration_publish_secret: str | None = None
    process_role: str = "all"
    execute_concurrency: int | None = None
    worker_id: str | None = None
    callback_url: str | None = None
    event_callback_url: str | None = None
    callback_token: str | None = None
    callback_secret: str | None = None
    callback_send_interval_ms: int = 500
    callback_retry_base_ms: int = 1000
    callback_retry_max_ms: int = 3600000
    callback_give_up_ms: int = 86400000
    codex_commands: str = "disabled"
    celery_events: str = "disabled"
    db_prepared_statements: bool = False
    handler_modules: str = ""
    planner_module: str = "app.factory.planner"
    codex_output_tail_bytes: int = 4096
    codex_uid_range: str = "1879048192-1879052287"
    codex_user: str = "nobody"
    codex_filesystem: str = "private"
    codex_visible_paths: str = "/usr,/bin,/sbin,/lib,/lib32,/lib64,/libx32,/etc,/opt,/sys"
    codex_tmpfs_mb: int = 64
    codex_network: str = "none"
    codex_memory_mb: int = 1024
    codex_cpu_seconds: int = 3600
    codex_max_processes: int = 256
    codex_max_file_mb: int = 1024
    codex_max_open_files: int = 1024
    codex_workspace_root: str | None = None
    codex_scratch_root: str | None = None
    max_commands_per_job: int = 1000
    max_page_bytes: int = 1048576
    sse_max_streams_per_token: int = 10
    sse_max_streams_per_process: int = 200
    rate_limit_writes: str = "600/minute"
    log_format: str = "plain"
    log_level: str = "INFO"
    metrics_token: str | None = None
    worker_metrics_port: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``SETTINGS`` variable; an unparsable value names the variable."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in SETTINGS:
            raw = source.get(s.env)
            if raw is None or raw.strip() == "":
                raw = s.default
            if raw is None:
                values[s.attr] = None
                continue
            try:
                values[s.attr] = s.parse(raw)
            except ValueError as exc:
                raise ValueError(f"{s.env}: cannot parse {raw!r} ({exc})") from exc
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
    def embedded(self) -> bool:
        return not self.database_url

    @property
    def callback_targets(self) -> tuple[str, ...]:
        """Where callback events go (spec step 6): both URLs when set, each once."""
        return tuple(dict.fromkeys(u for u in (self.callback_url, self.event_callback_url) if u))

    @property
    def auth_disabled(self) -> bool:
        return self.auth.strip().lower() == "disabled"

    @property
    def celery_events_enabled(self) -> bool:
        return self.celery_events.strip().lower() == "enabled"

    @property
    def codex_commands_enabled(self) -> bool:
        return self.codex_commands.strip().lower() == "enabled"


def normalise_database_url(url: str) -> str:
    """PaaS add-ons hand out ``postgres://``; SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3.

    Receipt ships psycopg2, so both spellings are pinned to ``postgresql+psycopg2://``.
    """
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


# Settings whose whole value is a secret, and settings that are URLs which may carry one.
SECRET_SETTINGS = frozenset({"callback_token"})
URL_SETTINGS = frozenset({"database_url", "redis_url", "callback_url", "event_callback_url"})
MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with its password (and any query string, where tokens ride) replaced by ``***``."""
    parts = urlsplit(url)
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
    """The settings as ``receipt config`` prints them: passwords and tokens shown as ``***``."""
    out: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value and f.name in SECRET_SETTINGS:
            value = MASK
        elif value and f.name in URL_SETTINGS:
            value = mask_url(str(value))
        out[f.name] = value
    return out


def settings_markdown_table() -> str:
    """The README's configuration table, generated from ``SETTINGS``."""
    rows = ["| variable | default | what it bounds |", "|---|---|---|"]
    for s in SETTINGS:
        default = "(unset)" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.env}` | {default} | {s.doc} |")
    return "\n".join(rows)


def _check_defaults_agree() -> None:
    # The dataclass defaults and the registry defaults are one fact written twice for typing's
    # sake; this import-time check makes a disagreement impossible to ship.
    parsed = Settings.from_env({})
    declared = Settings()
    for f in fields(Settings):
        if getattr(parsed, f.name) != getattr(declared, f.name):
            raise AssertionError(f"config default mismatch for {f.name}")


_check_defaults_agree()
