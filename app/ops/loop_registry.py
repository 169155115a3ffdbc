"""Every recovery loop, declared once: its name, schedule, Celery queue and task, and claim policy.

A recovery loop is a periodic, idempotent pass that recovers what a lost message, a dead process or
a missed wake-up left behind (River runs these as the services of one ``QueueMaintainer``, Oban as
plugins). Everything about running one derives from its ``Loop`` below:

- beat's schedule (``beat_schedule``, which ``celeryconfig`` and ``tasks/celery_app.py`` call), and
  the first pass after a startup delay where a loop declares one;
- the Celery task carrying each tick (``tasks/celery_app.py`` registers one per loop), and the pass
  it runs (``workers/loop_passes.py`` binds each loop's pass with ``@binds``, in the one claim-and-renew
  wrapper ``app.storage.loop_claims.run_claimed``, with the policy ``policy`` derives from the
  declaration);
- the local ticker that runs an overdue loop without beat, in every process that consumes that
  loop's queue (``workers/loop_passes.py``);
- ``/readyz``'s overdue check (``status``, in ``api/health.py``), the loop gauges and pass counters of
  ``/metrics`` (``app/ops/metrics.py``), the dashboard's intervals, and the loop table in
  docs/reliability.md (``markdown_table``; a test compares the two).

So adding a loop is one declaration here plus its pass. Pure: no I/O, and ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from app.config import SETTINGS, Setting, Settings
from app.cron import next_after
from app.factory import watchdog
from app.jobs.routing import MAINTENANCE_QUEUE, OBJECTIVES_QUEUE
from app.storage.loop_claims import STALE_FACTOR, Policy, claim_ttl_ms


class ScheduleError(ValueError):
    """A loop's schedule setting cannot be run (an invalid cron expression, a negative interval)."""


def _setting(attr: str) -> Setting:
    for s in SETTINGS:
        if s.attr == attr:
            return s
    raise KeyError(f"no setting declares the Settings field {attr!r}")


def _ms(text: str | None) -> str:
    """A default in milliseconds as the spec writes it: ``15 000 ms``."""
    return "unset" if text is None else f"{int(text):,} ms".replace(",", " ")


@dataclass(frozen=True)
class Every:
    """A pass every ``interval`` (a ``Settings`` field, in ms); where ``first_delay`` (also a field,
    in ms) is set, the first pass runs that long after a process starts instead of a whole interval.
    ``on_the_second``: beat sends the ticks on the clock's whole seconds (a cron with a seconds
    field) when the interval is a whole number of seconds dividing a minute, so a pass starts just
    after the moments things fall due (schedule ticks are whole seconds) rather than up to an
    interval later."""

    interval: str
    first_delay: str | None = None
    on_the_second: bool = False

    def period_ms(self, settings: Settings, now: datetime) -> int:
        value = int(getattr(settings, self.interval))
        if value < 0:
            raise ScheduleError(f"{_setting(self.interval).env}={value} must be 0 or more milliseconds")
        return value

    def first_delay_ms(self, settings: Settings) -> int | None:
        return None if self.first_delay is None else int(getattr(settings, self.first_delay))

    def after(self, settings: Settings, reference: datetime, periods: int) -> datetime:
        """When ``periods`` whole periods have passed since ``reference``."""
        return reference + timedelta(milliseconds=periods * self.period_ms(settings, reference))

    def celery(self, settings: Settings, cron: Callable[[str], Any] | None) -> Any:
        period = self.period_ms(settings, datetime.now(UTC))
        seconds, rest = divmod(period, 1000)
        if self.on_the_second and cron is not None and rest == 0 and seconds and 60 % seconds == 0:
            # Six fields, the seconds first (the cron engine's one order, app/cron.py).
            return cron(f"*/{seconds} * * * * *")
        return timedelta(milliseconds=period)

    def describe(self) -> str:
        s = _setting(self.interval)
        text = f"every `{s.env}` ({_ms(s.default)})"
        if self.on_the_second:
            text += ", on the clock's whole seconds"
        if self.first_delay is not None:
            d = _setting(self.first_delay)
            text += f"; the first pass `{d.env}` ({_ms(d.default)}) after start"
        return text


@dataclass(frozen=True)
class Cron:
    """A pass at every tick of a cron expression: the ``Settings`` field ``setting``, as
    ``expression(settings)`` reads and checks it (raising ``ValueError`` when it is invalid)."""

    setting: str
    expression: Callable[[Settings], str]

    def checked(self, settings: Settings) -> str:
        try:
            return self.expression(settings)
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None

    def period_ms(self, settings: Settings, now: datetime) -> int:
        """The gap between the next two ticks after ``now``."""
        expr = self.checked(settings)
        first = next_after(expr, now)
        return int((next_after(expr, first) - first) / timedelta(milliseconds=1))

    def first_delay_ms(self, settings: Settings) -> int | None:
        return None

    def after(self, settings: Settings, reference: datetime, periods: int) -> datetime:
        """The ``periods``-th tick after ``reference``."""
        expr = self.checked(settings)
        at = reference
        for _ in range(periods):
            at = next_after(expr, at)
        return at

    def celery(self, settings: Settings, cron: Callable[[str], Any] | None) -> Any:
        return None if cron is None else cron(self.checked(settings))

    def describe(self) -> str:
        s = _setting(self.setting)
        return f"cron `{s.env}` (`{s.default}`)"


Schedule = Every | Cron


@dataclass(frozen=True)
class Claim:
    """How a pass holds its loop (always single-flight, through a renewed ``loop_runs`` claim).

    ``spacing``: a tick arriving within this fraction of a period after the previous pass started
    is a duplicate (two beats) and is skipped. ``holds``: renewed from a background thread until
    the pass settles, so a slow pass keeps the loop; otherwise renewed only between the pass's
    items, so a pass stalled inside one item loses the loop at its deadline. ``slow_after``: a
    ``Settings`` field (ms) that only *observes*: past it the pass logs ``slow_event`` and runs on.
    """

    spacing: float = 0.5
    holds: bool = False
    slow_after: str | None = None
    slow_event: str = ""

    def describe(self) -> str:
        parts = ["single-flight"]
        if self.spacing > 0:
            share = "half a" if self.spacing == 0.5 else f"{self.spacing:g} of a"
            parts.append(f"a tick within {share} period of the last pass is skipped")
        else:
            parts.append("every tick runs")
        if self.holds:
            parts.append("the claim is held until the pass settles")
        else:
            parts.append("renewed between items (a pass stalled in one item loses the loop)")
        if self.slow_after is not None:
            s = _setting(self.slow_after)
            parts.append(f"past `{s.env}` ({_ms(s.default)}) it logs `{self.slow_event}` and runs on")
        return "; ".join(parts)


def _always(settings: Settings) -> bool:
    return True


def _callbacks_configured(settings: Settings) -> bool:
    return bool(settings.callback_targets)


@dataclass(frozen=True)
class Loop:
    """One recovery loop. ``name`` keys its ``loop_runs`` row, its beat entry, its metric label and
    its ``/readyz`` entry; ``task`` and ``queue`` carry beat's tick; ``enabled`` says whether this
    deployment runs it at all."""

    name: str
    task: str
    queue: str
    schedule: Schedule
    doc: str
    claim: Claim = field(default_factory=Claim)
    enabled: Callable[[Settings], bool] = _always


QUEUED_REDRIVE: Final = Loop(
    name="queued-redrive",
    task="receipt.redrive_queued",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("queued_redrive_interval_ms", first_delay="queued_redrive_startup_delay_ms"),
    doc="Re-delivers queued jobs older than the minimum age, at most once per cooldown per job "
    "(dispatch key `<jobId>:redrive:<seq>:<status>`), and ends delivery records that can no longer matter.",
)
LEASE_EXPIRY: Final = Loop(
    name="lease-expiry",
    task="receipt.expire_leases",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("lease_expiry_interval_ms"),
    doc="Appends `job.lease_expired` for every lease past its deadline (database clock).",
)
DUE_RETRIES: Final = Loop(
    name="due-retries",
    task="receipt.dispatch_due_retries",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("retry_scan_interval_ms"),
    doc="Starts delivery of every retry whose backoff has passed, and of every delayed job whose "
    "`availableAt` has come.",
)
CALLBACKS: Final = Loop(
    name="callbacks",
    task="receipt.send_callbacks",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("callback_send_interval_ms"),
    doc="Delivers the callback outbox (signed, at least once, in order per job). Runs only where a "
    "callback URL is set.",
    enabled=_callbacks_configured,
)
OUTBOX_REDRIVE: Final = Loop(
    name="objective-outbox-redrive",
    task="receipt.objective_outbox_redrive",
    queue=OBJECTIVES_QUEUE,
    schedule=Every("objective_control_outbox_redrive_interval_ms"),
    doc="Enqueues a control job for every unconsumed objective control request that has none (a lost "
    "control message), the audit of an ended objective whose audit job was lost, and delivers a "
    "control job whose wake-up was lost.",
    claim=Claim(
        holds=True,
        slow_after="objective_control_outbox_redrive_timeout_ms",
        slow_event="factory.control_outbox_redrive_slow",
    ),
)
OBJECTIVE_WATCHDOG: Final = Loop(
    name="objective-watchdog",
    task="receipt.objective_watchdog_tick",
    queue=OBJECTIVES_QUEUE,
    schedule=Cron("objective_watchdog_cron", watchdog.cron_expression),
    doc="Enqueues the tick's `factory.objective.watchdog` job (one per tick: its id names the tick), "
    "which reconciles every stalled or lost objective. "
    "Off with `RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED=0`.",
    # A tick consumed late must not be skipped as too close to the previous one; a repeated tick
    # is harmless, since its job id makes the second enqueue a no-op.
    claim=Claim(spacing=0.0),
    enabled=watchdog.enabled,
)

SCHEDULES: Final = Loop(
    name="schedules",
    task="receipt.fire_schedules",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("schedule_scan_interval_ms", on_the_second=True),
    doc="Fires every due schedule tick (one job per tick, id `<scheduleId>:<tick>`), records the ticks "
    "outside a schedule's catch-up window missed and the ones its overlap policy skips or buffers; "
    "paged (`RECEIPT_SCHEDULE_PAGE_SIZE` schedules per transaction).",
    # Held while it runs (a pass over 10 000 schedules takes seconds): ticks meanwhile coalesce.
    claim=Claim(holds=True),
)

WORKER_LIVENESS: Final = Loop(
    name="worker-liveness",
    task="receipt.expire_dead_workers",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("worker_liveness_scan_interval_ms"),
    doc="Declares dead every worker process whose liveness record lapsed past "
    "`RECEIPT_WORKER_DEAD_AFTER_MS` (database clock) and appends `job.lease_expired` (error "
    "`worker <id> liveness lapsed`) for each job it holds, whatever its lease deadline.",
)


LOST_DELIVERIES: Final = Loop(
    name="lost-deliveries",
    task="receipt.redeliver_lost",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("lost_delivery_scan_interval_ms"),
    doc="Ends every pending delivery of a queued job whose message is lost -- sent at least "
    "`RECEIPT_REDELIVER_UNFETCHED_MS` ago, fetched by nobody, its queue empty (`unfetched`), or "
    "died with the process that fetched it (`fetcher_lost`) -- and sends the job again at once "
    "(dispatch key `<jobId>:redrive:<seq>:<status>`; the attempt fence makes a late original inert).",
)


def _retention_configured(settings: Settings) -> bool:
    return settings.retention_enabled


ARCHIVE: Final = Loop(
    name="archive",
    task="receipt.archive",
    queue=MAINTENANCE_QUEUE,
    schedule=Every("archive_interval_ms"),
    doc="Moves every job and objective that ended longer ago than its organisation's retention window "
    "to the archive (`RECEIPT_ARCHIVE_DIR`), one segment per page of `RECEIPT_ARCHIVE_PAGE_SIZE` "
    "streams, leaving a tombstone per stream. Runs only where a retention window is set.",
    # Held while it runs (a page writes a segment and removes thousands of rows): ticks coalesce.
    claim=Claim(holds=True),
    enabled=_retention_configured,
)

LOOPS: Final[tuple[Loop, ...]] = (
    QUEUED_REDRIVE,
    LEASE_EXPIRY,
    DUE_RETRIES,
    CALLBACKS,
    OUTBOX_REDRIVE,
    OBJECTIVE_WATCHDOG,
    SCHEDULES,
    WORKER_LIVENESS,
    LOST_DELIVERIES,
    ARCHIVE,
)


def _unique(loops: Sequence[Loop]) -> None:
    for attr in ("name", "task"):
        values = [getattr(loop, attr) for loop in loops]
        if len(values) != len(set(values)):
            raise ValueError(f"two recovery loops share a {attr}: {sorted(values)}")


_unique(LOOPS)


def settings_read() -> frozenset[str]:
    """The ``Settings`` fields the declarations name (read with ``getattr`` where a loop runs)."""
    fields: set[str] = set()
    for loop in LOOPS:
        sched = loop.schedule
        if isinstance(sched, Every):
            fields.add(sched.interval)
            if sched.first_delay is not None:
                fields.add(sched.first_delay)
        else:
            fields.add(sched.setting)
        if loop.claim.slow_after is not None:
            fields.add(loop.claim.slow_after)
    return frozenset(fields)


def interval_settings() -> tuple[Setting, ...]:
    """The interval declaration of every loop that runs on one (a test deployment with no worker
    sets them long, so ``/readyz`` does not rightly call it not ready)."""
    return tuple(_setting(loop.schedule.interval) for loop in LOOPS if isinstance(loop.schedule, Every))


def active(settings: Settings) -> tuple[Loop, ...]:
    """The loops this deployment runs."""
    return tuple(loop for loop in LOOPS if loop.enabled(settings))


def by_name(name: str) -> Loop:
    for loop in LOOPS:
        if loop.name == name:
            return loop
    raise KeyError(f"no recovery loop is named {name!r}; known: {', '.join(loop.name for loop in LOOPS)}")


def cron_tasks() -> frozenset[str]:
    """Tasks whose message carries the time beat published it (a cron pass names its tick by it)."""
    return frozenset(loop.task for loop in LOOPS if isinstance(loop.schedule, Cron))


def schedule_errors(settings: Settings) -> list[str]:
    """Why an active loop's schedule cannot run (beat refuses to start on any)."""
    errors = []
    now = datetime.now(UTC)
    for loop in active(settings):
        try:
            loop.schedule.period_ms(settings, now)
        except ScheduleError as exc:
            errors.append(str(exc))
    return errors


def policy(loop: Loop, settings: Settings, now: datetime) -> Policy:
    """The claim policy one pass of ``loop`` runs under (``app.storage.loop_claims.run_claimed``)."""
    period = loop.schedule.period_ms(settings, now)
    slow = loop.claim.slow_after
    return Policy(
        ttl_ms=claim_ttl_ms(period),
        spacing_ms=int(period * loop.claim.spacing),
        holds=loop.claim.holds,
        slow_after_ms=None if slow is None else int(getattr(settings, slow)),
        slow_event=loop.claim.slow_event,
    )


# -- beat ------------------------------------------------------------------------------------------


def beat_schedule(settings: Settings, cron: Callable[[str], Any] | None = None) -> dict[str, dict[str, Any]]:
    """Beat's schedule: one entry per active loop, firing its task onto its queue.

    ``cron`` turns a cron expression into a Celery schedule (``tasks.cron.CronSchedule``); without
    it (the plain-data Celery configuration, which imports no Celery) cron loops are left out, and
    so is a loop whose schedule cannot run (beat refuses to start on it: ``schedule_errors``). A
    tick nobody consumed within a period (at least 1 s) is dropped, not piled up behind a dead
    consumer: the next tick does the same work.
    """
    now = datetime.now(UTC)
    entries: dict[str, dict[str, Any]] = {}
    for loop in active(settings):
        try:
            schedule = loop.schedule.celery(settings, cron)
            period_s = loop.schedule.period_ms(settings, now) / 1000
        except ScheduleError:
            continue
        if schedule is None:
            continue
        entries[loop.name] = {
            "task": loop.task,
            "schedule": schedule,
            "options": {"queue": loop.queue, "expires": max(1.0, period_s)},
        }
    return entries


def first_passes(settings: Settings) -> list[tuple[Loop, int]]:
    """The active loops whose first pass runs a startup delay (ms) after a process starts."""
    out = []
    for loop in active(settings):
        delay = loop.schedule.first_delay_ms(settings)
        if delay is not None:
            out.append((loop, delay))
    return out


# -- is a loop overdue? ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """One loop as ``/readyz`` reports it."""

    name: str
    last_run: datetime | None
    age_ms: int | None
    interval_ms: int | None
    overdue: bool
    error: str | None = None


def overdue(
    loop: Loop, settings: Settings, last: datetime | None, since: datetime, now: datetime, periods: int
) -> bool:
    """True when more than ``periods`` periods have passed since the loop's last pass started (or,
    for a loop that never ran, since ``since``: the observer's start, a fresh deployment's grace)."""
    reference = last if last is not None else since
    return now > loop.schedule.after(settings, reference, periods)


def status(
    loop: Loop,
    settings: Settings,
    last: datetime | None,
    since: datetime,
    now: datetime,
    periods: int = STALE_FACTOR,
) -> Status:
    """``loop``'s last run, age, period, and whether it is overdue (3 periods, ``/readyz``'s rule).

    A schedule that cannot run is reported as an error, and counts as overdue: the loop never runs.
    """
    age = int((now - last) / timedelta(milliseconds=1)) if last is not None else None
    try:
        interval = loop.schedule.period_ms(settings, now)
        late = overdue(loop, settings, last, since, now, periods)
    except ScheduleError as exc:
        return Status(loop.name, last, age, None, True, str(exc))
    return Status(loop.name, last, age, interval, late)


# -- the docs table --------------------------------------------------------------------------------


def markdown_table(consumers: Mapping[str, Sequence[str]]) -> str:
    """The loop table of docs/reliability.md. ``consumers`` maps each queue to the process roles
    that consume it (``workers.roles``), which is where its loop's ticks run."""
    rows = [
        "| loop | schedule | queue (consumed by) | Celery task | claim | a pass |",
        "|---|---|---|---|---|---|",
    ]
    for loop in LOOPS:
        roles = ", ".join(f"`{r}`" for r in consumers.get(loop.queue, ()))
        rows.append(
            f"| `{loop.name}` | {loop.schedule.describe()} | `{loop.queue}` ({roles}) | `{loop.task}` | "
            f"{loop.claim.describe()} | {loop.doc} |"
        )
    return "\n".join(rows)
