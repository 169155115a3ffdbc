"""kombu's filesystem transport, made safe to read while it is written, and to read garbage.

kombu's own ``filesystem`` transport creates a message file and then writes it: a consumer
listing the folder in between claims an empty file, ``loads`` raises inside the worker's consumer
loop, Celery logs "Unrecoverable error" and the worker stops, the message already gone (kombu#1551).
This channel changes three things and keeps kombu's folder layout and file names, so processes of
the previous release read and write the same folder:

- **put:** the message is written under ``<name>.tmp`` in the same folder and ``os.replace``d to
  its name, an atomic rename on POSIX: a consumer sees a whole file or none. A ``.tmp`` name does
  not end in ``.<queue>.msg``, so every consumer, kombu's own included, skips it.
- **get:** the folder is listed once per backlog rather than once per message, and a file is
  claimed by renaming it into ``claimed/`` beside the data folder (one rename:
  exactly one consumer wins), where kombu moved it to the system temporary folder, which may be
  another file system (a copy and a delete).
- **a message that cannot be decoded** (empty, torn, not JSON, no envelope kombu can read) is
  moved to the dead letters (``app/ops/dead_letters.py``), logged once with its queue and hash,
  and the consumer goes on to the next file instead of raising.

Selected by ``broker_transport`` for the embedded broker URL (``celeryconfig.py``).
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from contextlib import suppress
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils import json as kombu_json
from kombu.utils.objects import cached_property

from app.ops.dead_letters import FolderDeadLetters
from delivery.envelope import decode_envelope

TMP_SUFFIX = ".tmp"
_json: Any = kombu_json  # kombu ships no type hints


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        temporary = final + TMP_SUFFIX
        try:
            with open(temporary, "wb", buffering=0) as f:
                f.write(_json.dumps(payload).encode())
            os.replace(temporary, final)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(temporary)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        backlog = self._backlogs.setdefault(queue, deque())
        if not backlog:
            suffix = f"{queue}.msg"
            backlog.extend(
                sorted(n for n in os.listdir(self.data_folder_in) if n.partition(".")[2] == suffix)
            )
        folder = self.data_folder_in
        claimed = self._claim_folder
        while backlog:
            name = backlog.popleft()
            path = claimed / name
            try:
                os.rename(os.path.join(folder, name), path)
            except OSError:  # another consumer took it first
                continue
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {str(path)!r} from queue.") from exc
            payload, reason = decode_envelope(self, raw)
            if payload is None:
                self._dead_letters.keep(path, queue, raw, reason)
                continue
            with suppress(OSError):
                os.unlink(path)
            return payload
        raise Empty()

    @cached_property
    def _backlogs(self) -> dict[str, deque[str]]:
        """Per queue, the names one listing found and this channel has not tried yet, oldest first:
        the folder is listed again only once they are used up, not on every get (kombu lists and
        sorts it per message, quadratic in a backlog). Newer messages have later names, so the
        order stays first in, first out."""
        return {}

    @cached_property
    def _claim_folder(self) -> Path:
        path = Path(
            self.transport_options.get("claim_folder") or Path(self.data_folder_in).parent / "claimed"
        )
        path.mkdir(parents=True, exist_ok=True)
        return path

    @cached_property
    def _dead_letters(self) -> FolderDeadLetters:
        folder = self.transport_options.get("dead_letter_folder") or Path(self.data_folder_in).parent / "dead"
        return FolderDeadLetters(Path(folder))


class Transport(filesystem.Transport):
    Channel = Channel
