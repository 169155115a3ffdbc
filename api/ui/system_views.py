"""The system page: queues and their consumers, the recovery loops' last runs, the last hour's events,
retention (what the archiving pass moved, what is left, the archive's free space), and the
configuration this web process runs with (as ``receipt config`` shows it: secrets as ``***``).

Everything here spans every organisation (a queue's depth counts everyone's jobs), so only a
system token sees it; an organisation's token gets a 403 page saying so.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import current_app, render_template
from flask.typing import ResponseReturnValue
from sqlalchemy.engine import Connection

from api.context import read_connection, state
from api.ui import UiError, blueprint, current_session
from api.ui.system import QueueOverview
from api.wake import WakePublisher
from app.config import SETTINGS, Settings, redacted
from app.dispatch import line
from app.jobs.routing import QUEUES
from app.ops import loop_registry
from app.retention import archive
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.storage import overview
from app.storage.db import db_now

WINDOW = timedelta(hours=1)
PROBE_EXTENSION = "receipt.ui.broker_probe"


def probe() -> QueueOverview:
    """The page's broker reader: through the API's own delivery client when it has one (its
    wake-up publisher's), so the web process keeps one Celery app and one connection pool."""
    found = current_app.extensions.get(PROBE_EXTENSION)
    if found is None:
        st = state()
        waker = st.waker
        found = QueueOverview(
            st.settings, (lambda: waker.delivery) if isinstance(waker, WakePublisher) else None
        )
        current_app.extensions[PROBE_EXTENSION] = found
    value: QueueOverview = found
    return value


@blueprint.get("/system")
def system() -> ResponseReturnValue:
    if not current_session().identity.system:
        raise UiError(
            403,
            "System token needed",
            "The system page spans every organisation: sign in with a system token.",
        )
    st = state()
    with read_connection(st.engine) as conn:
        loops = overview.loop_runs_all(conn)
        recent = overview.recent_events(conn, window=WINDOW)
        retention = _retention(conn, st.settings)
        shares = line.shares(conn, st.settings, db_now(conn), list(QUEUES.values()))
    # The loops this deployment runs (app/ops/loop_registry.py), and each one's period (for "is it late?").
    intervals = {}
    now = datetime.now(UTC)
    for loop in loop_registry.active(st.settings):
        try:
            intervals[loop.name] = loop.schedule.period_ms(st.settings, now)
        except loop_registry.ScheduleError:
            continue
    known = {run.name for run in loops}
    never = sorted(name for name in intervals if name not in known)
    ages = {run.name: (recent.now - run.started_at).total_seconds() for run in loops if run.started_at}
    shown = redacted(st.settings)
    return render_template(
        "system.html",
        broker=probe().report(),
        loops=loops,
        never=never,
        intervals=intervals,
        ages=ages,
        recent=recent,
        configuration=[(s.env, shown[s.attr]) for s in SETTINGS],
        retention=retention,
        shares=shares,
    )


def _retention(conn: Connection, settings: Settings) -> dict[str, Any]:
    """What the retention section shows: the policy, what the latest passes moved, what is left to
    move (the oldest ended job still here) and the room left where segments go."""
    ended = archive.oldest_live_terminal(conn)
    policy = Policy.from_settings(settings)
    return {
        "enabled": policy.enabled,
        "days": policy.days,
        "overrides": sorted(policy.by_organization.items()),
        "directory": str(settings.archive_path),
        "free_bytes": DirectorySink(settings.archive_path).free_bytes() if policy.enabled else None,
        "oldest_age_s": (db_now(conn) - ended).total_seconds() if ended is not None else None,
        "passes": archive.recent_passes(conn),
    }
