"""The one config object: each setting declared once (defaults, parsing, marks), the one on/off
parser, redaction by the secret mark, URL normalisation, and the README table."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from app.config import (
    MASK,
    OFF,
    ON,
    SETTINGS,
    Settings,
    declared,
    mask_url,
    normalise_database_url,
    redacted,
    setting,
    settings_markdown_table,
    switch,
)
from app.jobs import kinds
from app.ops import loop_registry
from app.redaction import MIN_SECRET_TEXT, Redactor, url_secret_texts

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_is_generated_from_settings() -> None:
    text = README.read_text()
    table = text.split("<!-- config-table:start -->\n", 1)[1].split("\n<!-- config-table:end -->", 1)[0]
    assert table == settings_markdown_table(), "run `receipt config --markdown` and paste it into README.md"


def test_every_setting_has_a_distinct_env_name_and_attribute() -> None:
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)
    assert len({s.attr for s in SETTINGS}) == len(SETTINGS)


def test_spec_defaults() -> None:
    s = Settings.from_env({})
    assert s.job_lease_ms == 300_000
    assert s.factory_control_job_lease_ms == 900_000
    assert s.codex_job_lease_ms == 900_000
    assert s.active_stale_ms == 600_000
    assert s.queued_redrive_interval_ms == 15_000
    assert s.queued_redrive_min_age_ms == 30_000
    assert s.queued_redrive_cooldown_ms == 15_000
    assert s.startup_settle_ms == 1_000
    assert s.objective_watchdog_cron == "* * * * *"
    assert s.max_body_bytes == 1_048_576


def test_unparsable_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="JOB_LEASE_MS"):
        Settings.from_env({"JOB_LEASE_MS": "soon"})


@pytest.mark.parametrize(
    "url, expected",
    [
        ("postgres://u:p@h:5432/db", "postgresql+psycopg2://u:p@h:5432/db"),
        ("postgresql://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_database_urls_are_normalised_to_psycopg2(url: str, expected: str) -> None:
    assert normalise_database_url(url) == expected


def test_embedded_default_is_a_sqlite_file_under_receipt_home(tmp_path: Path) -> None:
    s = Settings.from_env({"RECEIPT_HOME": str(tmp_path)})
    assert s.embedded and s.sqlalchemy_url == f"sqlite:///{tmp_path / 'receipt.db'}"


# The Factory/objective settings another branch is wiring up; every
# other listed setting must be read by the code it configures.
FACTORY_SETTINGS_IN_PROGRESS = frozenset(
    {
        "startup_settle_ms",
        "objective_control_outbox_redrive_interval_ms",
        "objective_control_outbox_redrive_timeout_ms",
        "objective_watchdog_cron",
        "objective_watchdog_enabled",
    }
)
PRODUCTION = ("app", "api", "delivery", "tasks", "workers")


def _production_source() -> str:
    root = README.parent
    config = root / "app" / "config.py"
    files = [p for pkg in PRODUCTION for p in (root / pkg).rglob("*.py") if p != config]
    return "\n".join(p.read_text() for p in [*files, root / "celeryconfig.py"])


def test_every_listed_setting_is_read_by_the_code_it_configures() -> None:
    """No setting in the README's table that nothing reads (directly or through a Settings property)."""
    source = _production_source()
    config_text = (README.parent / "app" / "config.py").read_text()
    # Properties of Settings that derive from a field: ``home_path`` reads ``self.home`` etc.
    properties = re.findall(
        r"def (\w+)\(self\) -> [^:]+:\n(?:\s+\"\"\".*?\"\"\"\n)?((?:\s{8}.*\n)+)", config_text
    )
    readers: dict[str, set[str]] = {}
    for name, body in properties:
        for attr in re.findall(r"self\.(\w+)", body):
            readers.setdefault(attr, set()).add(name)
    unread = []
    # The recovery loops name their schedule settings in their declarations (app/ops/loop_registry.py), the
    # kinds their lease rows' (app/jobs/kinds.py).
    by_declarations = loop_registry.settings_read() | kinds.settings_read()
    for declared_setting in SETTINGS:
        if declared_setting.attr in FACTORY_SETTINGS_IN_PROGRESS or declared_setting.attr in by_declarations:
            continue
        names = {declared_setting.attr, *readers.get(declared_setting.attr, set())}
        if not any(re.search(rf"\.{n}\b", source) for n in names):
            unread.append(declared_setting.env)
    assert unread == [], f"listed settings nothing reads: {unread}"


# -- declared once -------------------------------------------------------------------------------


def test_a_bare_settings_holds_each_declared_default_parsed() -> None:
    bare = Settings()
    for s in SETTINGS:
        expected = None if s.default is None else s.parse(s.default)
        assert getattr(bare, s.attr) == expected, s.env
    assert Settings.from_env({}) == bare


def test_every_field_is_a_declared_setting_in_the_readme_order() -> None:
    assert [s.attr for s in SETTINGS] == [f.name for f in dataclasses.fields(Settings)]
    assert all(s.env and s.doc for s in SETTINGS)


# -- one on/off parser ---------------------------------------------------------------------------

SWITCHES = [s for s in SETTINGS if s.parse is switch]


def test_every_on_off_setting_uses_the_one_parser() -> None:
    """A setting whose default is an on/off word is parsed by ``switch``, and only those are."""
    # A count whose default happens to be 0 or 1 is a number, not a switch (0 days: keep
    # everything; 0 ms of lead).
    numbers = {"RECEIPT_RETENTION_DAYS", "RECEIPT_SCHEDULE_LEAD_MS"}
    assert {s.env for s in SWITCHES} == {
        s.env for s in SETTINGS if s.default in ON + OFF and s.env not in numbers
    }
    assert {s.env for s in SWITCHES} >= {
        "RECEIPT_AUTH",
        "RECEIPT_CODEX_COMMANDS",
        "RECEIPT_CELERY_EVENTS",
        "RECEIPT_DB_PREPARED_STATEMENTS",
        "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED",
    }


@pytest.mark.parametrize("text", [*ON, "Enabled", " ON ", "True"])
def test_on_spellings(text: str) -> None:
    assert switch(text) is True
    for s in SWITCHES:
        assert getattr(Settings.from_env({s.env: text}), s.attr) is True, s.env


@pytest.mark.parametrize("text", [*OFF, "DISABLED", " off ", "False"])
def test_off_spellings(text: str) -> None:
    assert switch(text) is False
    for s in SWITCHES:
        assert getattr(Settings.from_env({s.env: text}), s.attr) is False, s.env


@pytest.mark.parametrize("text", ["maybe", "2", "enable", "y"])
def test_any_other_value_stops_the_process_naming_the_variable_and_the_allowed_values(text: str) -> None:
    for s in SWITCHES:
        with pytest.raises(ValueError, match=rf"{s.env}: cannot parse .*allowed values: enabled, disabled"):
            Settings.from_env({s.env: text})


def test_direct_construction_takes_bools_or_the_environment_spelling() -> None:
    assert Settings(auth=False).auth_disabled
    assert Settings(auth="disabled").auth is False  # type: ignore[arg-type]
    assert Settings(codex_commands="enabled").codex_commands is True  # type: ignore[arg-type]
    assert Settings(objective_watchdog_enabled="0").objective_watchdog_enabled is False  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="auth: cannot parse 'sometimes'"):
        Settings(auth="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="codex_commands is on/off"):
        Settings(codex_commands=1)  # type: ignore[arg-type]


# -- secrets are declared, and redaction follows the mark ----------------------------------------

MARKER = "m4rker-9f27c1"
# Names that say "this is a secret": any setting so named must carry the secret mark.
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
# Named like a secret, holding none: each one is a decision, with its reason.
NOT_SECRETS = {
    "RECEIPT_SSE_MAX_STREAMS_PER_TOKEN": "a count of event streams, per token",
    "RECEIPT_TOKEN_CACHE_MS": "how long a token's lookup is reused, in milliseconds",
}


def test_every_setting_named_like_a_secret_is_marked_secret_and_every_url_is_marked_url() -> None:
    for s in SETTINGS:
        if (SECRET_NAME.search(s.env) or SECRET_NAME.search(s.attr)) and s.env not in NOT_SECRETS:
            assert s.secret, f"{s.env} looks like a secret: declare it with secret=True"
        if s.env.endswith("_URL") or s.attr.endswith("_url"):
            assert s.url, f"{s.env} is a URL: declare it with url=True"
    assert set(NOT_SECRETS) <= {s.env for s in SETTINGS if not s.secret}
    marked = {s.env for s in SETTINGS if s.secret}
    assert marked == {
        "RECEIPT_CALLBACK_TOKEN",
        "RECEIPT_CALLBACK_SECRET",
        "RECEIPT_INTEGRATION_PUBLISH_SECRET",
        "RECEIPT_METRICS_TOKEN",
    }
    assert {s.env for s in SETTINGS if s.url} == {
        "DATABASE_URL",
        "REDIS_URL",
        "RECEIPT_RESONATE_CALLBACK_URL",
        "RECEIPT_EVENT_CALLBACK_URL",
        "RECEIPT_INTEGRATION_PUBLISH_URL",
    }


def marked_everywhere(cls: type[Settings] = Settings) -> Settings:
    """Every secret setting holds the marker; every URL setting holds it as password and query."""
    values: dict[str, Any] = {}
    for s in declared(cls):
        if s.secret:
            values[s.attr] = f"{MARKER}-{s.attr}"
        elif s.url:
            values[s.attr] = f"https://user:{MARKER}pw@host.example:8443/path?token={MARKER}q&x=1"
    return cls(**values)


def test_redacted_repr_and_the_redactor_hide_every_marked_value() -> None:
    settings = marked_everywhere()
    shown = redacted(settings)
    assert MARKER not in json.dumps(shown)
    assert MARKER not in repr(settings)
    for s in SETTINGS:
        if s.secret:
            assert shown[s.attr] == MASK
        elif s.url:
            assert shown[s.attr] == f"https://user:{MASK}@host.example:8443/path?{MASK}"
    text = " ".join(f"{s.env}={getattr(settings, s.attr)}" for s in SETTINGS)
    assert MARKER in text
    assert MARKER not in Redactor.of(settings)(text)


def test_a_secret_added_later_is_hidden_by_its_mark_alone() -> None:
    """A new secret needs nothing but ``secret=True``: receipt config, repr, logs and errors follow."""

    @dataclasses.dataclass(frozen=True, repr=False)
    class Later(Settings):
        signing_key: str | None = setting("RECEIPT_LATER_SIGNING_KEY", None, "A later secret.", secret=True)
        hook_url: str | None = setting("RECEIPT_LATER_HOOK_URL", None, "A later URL.", url=True)
        pin: int | None = setting("RECEIPT_LATER_PIN", None, "A secret with a parser.", int, secret=True)

    later = Later.from_env(
        {
            "RECEIPT_LATER_SIGNING_KEY": MARKER,
            "RECEIPT_LATER_HOOK_URL": f"https://hooks.example/in?sig={MARKER}",
            "RECEIPT_LATER_PIN": "48151623",
        }
    )
    assert later.signing_key == MARKER
    shown = redacted(later)
    assert shown["signing_key"] == MASK and shown["hook_url"] == "https://hooks.example/in?***"
    assert shown["pin"] == MASK
    assert MARKER not in json.dumps(shown) and MARKER not in repr(later) and "48151623" not in repr(later)
    hide = Redactor.of(later)
    assert (
        hide(f"GET /in?sig={MARKER} failed; key {MARKER}; pin 48151623")
        == "GET /in?*** failed; key ***; pin ***"
    )
    # An unparsable secret is named, never quoted (int()'s own message would quote it).
    with pytest.raises(ValueError) as bad:
        Later.from_env({"RECEIPT_LATER_PIN": f"not-a-pin-{MARKER}"})
    assert "RECEIPT_LATER_PIN" in str(bad.value) and MARKER not in str(bad.value)


def test_an_unparsable_ordinary_value_is_quoted_to_help() -> None:
    with pytest.raises(ValueError, match="JOB_LEASE_MS: cannot parse 'soon'"):
        Settings.from_env({"JOB_LEASE_MS": "soon"})


def test_url_secret_texts_cover_the_password_the_query_and_their_decoded_forms() -> None:
    found = url_secret_texts("redis://:p%40ss-word@cache:6379/0?token=a%2Fb-token&plain=1")
    assert {"p%40ss-word", "p@ss-word", "a/b-token", "token=a%2Fb-token&plain=1"} <= found
    assert url_secret_texts("redis://cache:6379/0") == set()
    token = "t0ken-" + "x" * 20
    assert url_secret_texts(f"https://{token}@example.com/") == {token}
    assert mask_url(f"https://{token}@example.com/") == "https://***@example.com/"
    # A lone user name is hidden in the shown URL, but not hunted in free text (it would mangle
    # every "postgresql://" of a log line whose database user is "postgres").
    assert url_secret_texts("postgresql://postgres@db:5432/receipt") == set()
    assert mask_url("postgresql://postgres@db:5432/receipt") == "postgresql://***@db:5432/receipt"
    # A URL that cannot be taken apart is hidden whole, in both forms.
    assert mask_url("http://u:pw-1234@[::1/x") == MASK
    assert url_secret_texts("http://u:pw-1234@[::1/x") == {"http://u:pw-1234@[::1/x"}


def test_the_redactor_ignores_texts_too_short_to_find_safely() -> None:
    hide = Redactor(["ab", "x" * MIN_SECRET_TEXT])
    assert hide("ab cd " + "x" * MIN_SECRET_TEXT) == "ab cd ***"
    assert repr(hide) == "Redactor(1 secret texts)"  # a logged Redactor shows none of them


def test_the_readme_table_says_which_settings_are_secrets() -> None:
    table = settings_markdown_table()
    for s in SETTINGS:
        [row] = [line for line in table.splitlines() if line.startswith(f"| `{s.env}` |")]
        assert ("Secret: shown as `***`" in row) == s.secret, s.env
        assert ("password and query string are shown as `***`" in row) == s.url, s.env


def test_the_delivery_batch_is_eight_attempts_by_default_and_never_less_than_one() -> None:
    assert Settings.from_env({}).delivery_batch_max == 8
    assert Settings.from_env({"RECEIPT_DELIVERY_BATCH_MAX": " 1 "}).delivery_batch_max == 1
    for bad in ("0", "-3", "many"):
        with pytest.raises(ValueError, match="RECEIPT_DELIVERY_BATCH_MAX"):
            Settings.from_env({"RECEIPT_DELIVERY_BATCH_MAX": bad})


def test_a_busy_process_holds_fetched_attempts_half_a_second_by_default_and_at_most_a_minute() -> None:
    assert Settings.from_env({}).delivery_hold_ms == 500
    assert Settings.from_env({"RECEIPT_DELIVERY_HOLD_MS": "0"}).delivery_hold_ms == 0
    assert Settings.from_env({"RECEIPT_DELIVERY_HOLD_MS": "60000"}).delivery_hold_ms == 60_000
    for bad in ("-1", "60001", "soon"):
        with pytest.raises(ValueError, match="RECEIPT_DELIVERY_HOLD_MS"):
            Settings.from_env({"RECEIPT_DELIVERY_HOLD_MS": bad})


def test_a_process_keeps_the_configured_number_of_postgres_connections_between_uses() -> None:
    from app.storage.db import engine_for

    url = "postgresql://u@127.0.0.1:5432/receipt"  # never connected: the pool is only sized
    assert Settings.from_env({"DATABASE_URL": url}).db_pool_size == 10
    engine = engine_for(Settings.from_env({"DATABASE_URL": url, "RECEIPT_DB_POOL_SIZE": "3"}))
    try:
        assert engine.pool.size() == 3  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    for bad in ("0", "-1", "ten"):
        with pytest.raises(ValueError, match="RECEIPT_DB_POOL_SIZE"):
            Settings.from_env({"RECEIPT_DB_POOL_SIZE": bad})


def test_organisation_weights_and_rate_limits_are_parsed_into_sorted_pairs() -> None:
    bare = Settings.from_env({})
    assert (bare.org_weights, bare.org_rate_limits) == ((), ())
    settings = Settings.from_env(
        {
            "RECEIPT_ORG_WEIGHTS": " org-b=0.5, org-a=3 ,",
            "RECEIPT_ORG_RATE_LIMITS": "org-a=20/s,org-b=300/min,org-c=7200/hour,org-d=1/sec",
        }
    )
    assert settings.org_weights == (("org-a", 3.0), ("org-b", 0.5))
    assert settings.org_rate_limits == (("org-a", 20.0), ("org-b", 5.0), ("org-c", 2.0), ("org-d", 1.0))
    assert Settings.from_env({"RECEIPT_ORG_WEIGHTS": "a=100"}).org_weights == (("a", 100.0),)


@pytest.mark.parametrize(
    ("env", "text", "said"),
    [
        ("RECEIPT_ORG_WEIGHTS", "org-a=0", "above 0 and at most 100"),
        ("RECEIPT_ORG_WEIGHTS", "org-a=-2", "above 0 and at most 100"),
        ("RECEIPT_ORG_WEIGHTS", "org-a=100.5", "above 0 and at most 100"),
        ("RECEIPT_ORG_WEIGHTS", "org-a=heavy", "above 0 and at most 100"),
        ("RECEIPT_ORG_WEIGHTS", "org-a=nan", "above 0 and at most 100"),
        ("RECEIPT_ORG_WEIGHTS", "org-a", "expected org=weight"),
        ("RECEIPT_ORG_WEIGHTS", "=3", "expected org=weight"),
        ("RECEIPT_ORG_WEIGHTS", "org-a=1,org-a=2", "org-a is given twice"),
        ("RECEIPT_ORG_RATE_LIMITS", "org-a=20", "expected org=N/s, org=N/min or org=N/h"),
        ("RECEIPT_ORG_RATE_LIMITS", "org-a=20/day", "expected org=N/s, org=N/min or org=N/h"),
        ("RECEIPT_ORG_RATE_LIMITS", "org-a=0/s", "above 0 and at most 100000"),
        ("RECEIPT_ORG_RATE_LIMITS", "org-a=200001/s", "above 0 and at most 100000"),
        ("RECEIPT_ORG_RATE_LIMITS", "org-a=fast/s", "expected org=N/s"),
    ],
)
def test_a_bad_organisation_policy_setting_stops_the_process_naming_it(
    env: str, text: str, said: str
) -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({env: text})
    assert str(refused.value).startswith(f"{env}: cannot parse") and said in str(refused.value)
