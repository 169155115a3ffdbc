"""The system page: queues and their consumers, the recovery loops' last runs, the last hour's events,
and the configuration this web process runs with (as ``receipt config`` shows it: secrets as ``***``).

Everything here spans every organisation (a queue's depth counts everyone's jobs), so only a
system token sees it; an organisation's token gets a 403 page saying so.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flask import current_app, render_template
from flask.typing import ResponseReturnValue

from api.context import read_connection, state
from api.ui import UiError, blueprint, current_session
from api.ui.system import QueueOverview
from api.wake import WakePublisher
from app.config import SETTINGS, redacted
from app.ops import loops as registry
from app.storage import overview

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
    # The loops this deployment runs (app/ops/loops.py), and each one's period (for "is it late?").
    intervals = {}
    now = datetime.now(UTC)
    for loop in registry.active(st.settings):
        try:
            intervals[loop.name] = loop.schedule.period_ms(st.settings, now)
        except registry.ScheduleError:
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
    )
