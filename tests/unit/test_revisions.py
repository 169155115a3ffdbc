"""The schema check's reading of the migrations, without Alembic, equals Alembic's own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from app.storage import revisions
from app.storage.migrate import MIGRATIONS


@pytest.fixture
def versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(revisions, "VERSIONS", tmp_path)
    revisions.chain.cache_clear()
    yield tmp_path
    revisions.chain.cache_clear()


def write(folder: Path, name: str, revision: str, down: str) -> None:
    (folder / f"{name}.py").write_text(f'"""{name}."""\n\nrevision = "{revision}"\ndown_revision = {down}\n')


def test_the_head_and_every_revision_are_alembics() -> None:
    script = ScriptDirectory(str(MIGRATIONS))
    assert revisions.head() == script.get_current_head()
    assert set(revisions.chain()) == {r.revision for r in script.walk_revisions()}
    for r in script.walk_revisions():
        assert revisions.chain()[r.revision] == tuple(r._all_down_revisions)
    assert revisions.known(revisions.head()) and not revisions.known("9999")


def test_a_merge_follows_both_branches_and_is_the_one_head(versions: Path) -> None:
    write(versions, "a", "a", "None")
    write(versions, "b", "b", '"a"')
    write(versions, "c", "c", '"a"')
    write(versions, "d", "d", '("b", "c")')
    (versions / "__init__.py").write_text("")
    assert revisions.head() == "d" and revisions.chain()["d"] == ("b", "c")


def test_two_heads_or_a_file_without_a_literal_revision_are_refused(versions: Path) -> None:
    write(versions, "a", "a", "None")
    write(versions, "b", "b", '"a"')
    write(versions, "c", "c", '"a"')
    with pytest.raises(ValueError, match=r"one head, not \['b', 'c'\]"):
        revisions.head()
    revisions.chain.cache_clear()
    (versions / "c.py").write_text("revision = compute()\n")
    with pytest.raises(ValueError, match=re.escape("c.py: `revision` is not a literal")):
        revisions.chain()
    revisions.chain.cache_clear()
    (versions / "c.py").write_text("down_revision = 'a'\n")
    with pytest.raises(ValueError, match=re.escape('c.py: no literal `revision = "..."`')):
        revisions.chain()
