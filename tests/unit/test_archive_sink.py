"""The directory sink: whole segments or none, private files, the same lines give the same bytes."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.retention.sink import DirectorySink


def lines(n: int) -> list[dict[str, Any]]:
    return [{"stream": "jobs/a/x", "seq": i, "body": {"n": i}} for i in range(1, n + 1)]


def test_a_segment_is_written_whole_and_read_back(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "archive")
    written = sink.write("seg-1", lines(3))
    assert (written.lines, written.bytes) == (3, sink.size_bytes("seg-1"))
    assert list(sink.read("seg-1")) == lines(3)
    assert sink.names() == ["seg-1"]
    assert stat.S_IMODE((tmp_path / "archive" / "seg-1.jsonl.gz").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "archive").stat().st_mode) == 0o700
    first = (tmp_path / "archive" / "seg-1.jsonl.gz").read_bytes()
    sink.write("seg-1", lines(3))
    assert (tmp_path / "archive" / "seg-1.jsonl.gz").read_bytes() == first
    free = sink.free_bytes()
    assert free is not None and free > 0


def test_a_write_that_dies_halfway_leaves_no_segment(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "archive")

    def dying() -> Iterator[dict[str, Any]]:
        yield from lines(2)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        sink.write("seg-2", dying())
    assert sink.names() == []
    with pytest.raises(FileNotFoundError):
        list(sink.read("seg-2"))
    # The partial file is cleared with the next removal.
    assert list((tmp_path / "archive").iterdir())
    sink.remove("seg-2")
    assert list((tmp_path / "archive").iterdir()) == []


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_a_segment_name_is_never_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not a segment name"):
        DirectorySink(tmp_path).write(name, lines(1))
