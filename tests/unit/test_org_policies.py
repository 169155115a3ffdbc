"""Organisation dispatch policies, merged (``app.dispatch.policies``): per field, the API's value,
else the setting's, else the default (weight 1, no rate limit). Pure: no database."""

from __future__ import annotations

from app.config import Settings
from app.dispatch.policies import DEFAULT, OrgPolicy, effective, every_effective, merged
from app.storage.org_policies import StoredPolicy

SETTINGS = Settings(
    org_weights=(("org-a", 3.0), ("org-b", 0.5)), org_rate_limits=(("org-a", 20.0), ("org-c", 5.0))
)


def test_an_organisation_nothing_names_has_the_default_policy() -> None:
    e = effective(SETTINGS, None, "org-z")
    assert (e.policy, e.weight_from, e.rate_from) == (DEFAULT, "default", "default")
    assert OrgPolicy(1.0, None) == DEFAULT


def test_the_settings_give_each_field_they_name() -> None:
    a, b, c = (effective(SETTINGS, None, org) for org in ("org-a", "org-b", "org-c"))
    assert (a.policy, a.weight_from, a.rate_from) == (OrgPolicy(3.0, 20.0), "setting", "setting")
    assert (b.policy, b.weight_from, b.rate_from) == (OrgPolicy(0.5, None), "setting", "default")
    assert (c.policy, c.weight_from, c.rate_from) == (OrgPolicy(1.0, 5.0), "default", "setting")


def test_the_api_overrides_the_settings_field_by_field() -> None:
    weight_only = effective(SETTINGS, StoredPolicy("org-a", 7.0, None), "org-a")
    assert (weight_only.policy, weight_only.weight_from, weight_only.rate_from) == (
        OrgPolicy(7.0, 20.0),
        "api",
        "setting",
    )
    both = effective(SETTINGS, StoredPolicy("org-a", 0.25, 2.0), "org-a")
    assert (both.policy, both.weight_from, both.rate_from) == (OrgPolicy(0.25, 2.0), "api", "api")
    assert (both.setting_weight, both.setting_rate_per_s) == (3.0, 20.0)


def test_the_merged_map_holds_every_organisation_not_at_the_default() -> None:
    stored = [StoredPolicy("org-d", None, 1.5), StoredPolicy("org-e", 1.0, None)]
    assert merged(SETTINGS, stored) == {
        "org-a": OrgPolicy(3.0, 20.0),
        "org-b": OrgPolicy(0.5, None),
        "org-c": OrgPolicy(1.0, 5.0),
        "org-d": OrgPolicy(1.0, 1.5),
    }
    assert [e.organization_id for e in every_effective(SETTINGS, stored)] == [
        "org-a",
        "org-b",
        "org-c",
        "org-d",
        "org-e",
    ]
    assert merged(Settings(), []) == {}
