"""kombu's filesystem transport (the embedded broker), with messages that appear whole.

kombu writes a message by creating its file in the queue folder and then writing into it, while a
consumer takes any file of its queue by moving it out of the folder and reading it: a consumer
that comes between the two reads an empty file, and the JSON error stops its worker ("Unrecoverable
error", celery/kombu#1551). On a busy machine the embedded deployment's workers then restart in a
loop. Here a message is written under a name no consumer takes (``.part``: not ``<queue>.msg``)
and renamed to its real name once complete, which on one filesystem is atomic: a consumer sees the
whole message or none.

Selected by ``broker_transport`` for the embedded broker URL (celeryconfig.py).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_filesystem
from kombu.utils import json as kombu_json

PARTIAL_SUFFIX = ".part"
# kombu's JSON (its types: datetimes, UUIDs, bytes), as its transport writes a message.
_dumps: Any = kombu_json.dumps


class Channel(kombu_filesystem.Channel):
    # kombu's two base classes name the message differently (message, payload): keep kombu's own.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` onto ``queue``: kombu's file name and content, written whole, then named."""
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL_SUFFIX
        try:
            with open(partial, "wb") as f:
                f.write(_dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(kombu_filesystem.Transport):
    Channel = Channel
