"""``/organizations/{organizationId}/dispatch`` and ``/organizations/dispatch``: a system token sets and
reads each organisation's fair-share weight and rate limit; the API's values override the settings;
an organisation's token gets 403 and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.config import ORG_RATE_RULE, ORG_WEIGHT_RULE
from app.dispatch import policies
from app.dispatch.policies import OrgPolicy
from app.storage import org_policies, store
from tests.support.api import ORG_A, ORG_B, Api, build_api, json_of, make_settings

pytestmark = pytest.mark.one_backend  # the rules above the storage: PostgreSQL alone


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[Api]:
    policies.forget_cached()
    settings = make_settings(
        tmp_path, org_weights=((ORG_A, 3.0), ("org-s", 0.5)), org_rate_limits=((ORG_A, 20.0),)
    )
    built = build_api(engine, settings)
    yield built
    assert built.state.internal_errors == 0
    policies.forget_cached()


def put(api: Api, org: str, who: str = "system", **body: Any) -> Any:
    return api.client.put(f"/organizations/{org}/dispatch", json=body, headers=api.headers(who))


def get(api: Api, org: str, who: str = "system") -> Any:
    return api.client.get(f"/organizations/{org}/dispatch", headers=api.headers(who))


def test_a_policy_nothing_names_is_the_default(api: Api) -> None:
    response = get(api, "org-nobody")
    assert response.status_code == 200
    assert json_of(response)["policy"] == {
        "organizationId": "org-nobody",
        "weight": None,
        "ratePerSecond": None,
        "updatedAt": None,
        "settings": {"weight": None, "ratePerSecond": None},
        "effective": {
            "weight": 1.0,
            "ratePerSecond": None,
            "weightFrom": "default",
            "ratePerSecondFrom": "default",
        },
    }


def test_the_settings_show_and_the_api_overrides_them_field_by_field(api: Api) -> None:
    before = json_of(get(api, ORG_A))["policy"]
    assert before["settings"] == {"weight": 3.0, "ratePerSecond": 20.0}
    assert before["effective"] == {
        "weight": 3.0,
        "ratePerSecond": 20.0,
        "weightFrom": "setting",
        "ratePerSecondFrom": "setting",
    }
    response = put(api, ORG_A, weight=0.5, ratePerSecond=None)
    assert response.status_code == 200, response.json
    policy = json_of(response)["policy"]
    assert (policy["weight"], policy["ratePerSecond"]) == (0.5, None) and policy["updatedAt"] is not None
    assert policy["effective"] == {
        "weight": 0.5,
        "ratePerSecond": 20.0,
        "weightFrom": "api",
        "ratePerSecondFrom": "setting",
    }
    assert json_of(get(api, ORG_A))["policy"] == policy
    # The dispatch pass of this process sees it at once.
    with api.engine.connect() as conn:
        assert policies.org_policies(conn, api.state.settings)[ORG_A] == OrgPolicy(0.5, 20.0)
    # Null gives a field back to the settings.
    cleared = json_of(put(api, ORG_A, weight=None, ratePerSecond=None))["policy"]
    assert cleared["effective"]["weightFrom"] == "setting" and cleared["updatedAt"] is None
    with api.engine.connect() as conn:
        assert policies.org_policies(conn, api.state.settings)[ORG_A] == OrgPolicy(3.0, 20.0)


def test_each_set_is_a_receipt_naming_who_set_it_and_the_same_policy_again_writes_nothing(api: Api) -> None:
    assert put(api, ORG_B, weight=2, ratePerSecond=0.5).status_code == 200
    count = api.receipt_count()
    assert put(api, ORG_B, weight=2.0, ratePerSecond=0.5).status_code == 200
    assert api.receipt_count() == count
    with api.engine.connect() as conn:
        [receipt] = store.read_stream(conn, org_policies.policy_stream(ORG_B))
    assert receipt.type == "organization.dispatch_set"
    assert (receipt.body["weight"], receipt.body["ratePerSecond"]) == (2.0, 0.5)
    assert receipt.body["by"]["system"] is True and receipt.body["by"]["tokenId"]


def test_the_list_holds_every_organisation_the_settings_or_the_api_name(api: Api) -> None:
    put(api, ORG_B, weight=None, ratePerSecond=100)
    response = api.client.get("/organizations/dispatch", headers=api.headers("system"))
    assert response.status_code == 200
    listed = json_of(response)["policies"]
    assert [p["organizationId"] for p in listed] == [ORG_A, ORG_B, "org-s"]
    assert [p["effective"]["weight"] for p in listed] == [3.0, 1.0, 0.5]
    assert listed[1]["effective"]["ratePerSecond"] == 100.0


@pytest.mark.parametrize("who", ["a", "b"])
def test_an_organisation_token_gets_403_even_for_its_own_and_nothing_is_written(api: Api, who: str) -> None:
    count = api.receipt_count()
    for response in (
        put(api, ORG_A, who, weight=50, ratePerSecond=None),
        get(api, ORG_A, who),
        api.client.get("/organizations/dispatch", headers=api.headers(who)),
    ):
        assert response.status_code == 403, response.json
        assert json_of(response)["error"]["code"] == "forbidden"
        assert "system token" in json_of(response)["error"]["message"]
    assert api.receipt_count() == count
    assert api.client.get("/organizations/dispatch").status_code == 401


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        ({"weight": 0, "ratePerSecond": None}, "weight", ORG_WEIGHT_RULE),
        ({"weight": -1, "ratePerSecond": None}, "weight", ORG_WEIGHT_RULE),
        ({"weight": 100.5, "ratePerSecond": None}, "weight", ORG_WEIGHT_RULE),
        ({"weight": "3", "ratePerSecond": None}, "weight", ORG_WEIGHT_RULE),
        ({"weight": 1, "ratePerSecond": 0}, "ratePerSecond", ORG_RATE_RULE),
        ({"weight": 1, "ratePerSecond": 100_001}, "ratePerSecond", ORG_RATE_RULE),
        ({"weight": 1}, "ratePerSecond", "is required"),
        ({"weight": 1, "ratePerSecond": None, "burst": 3}, "burst", "is not a known field"),
    ],
)
def test_a_bad_policy_is_a_400_naming_the_field_and_nothing_is_written(
    api: Api, body: dict[str, Any], field: str, said: str
) -> None:
    count = api.receipt_count()
    response = api.client.put(f"/organizations/{ORG_A}/dispatch", json=body, headers=api.headers("system"))
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["details"]["field"] == field and error["message"].startswith(f"{field}: {said}")
    assert api.receipt_count() == count


def test_a_bad_organisation_id_is_a_400(api: Api) -> None:
    response = api.client.get("/organizations/no%20spaces/dispatch", headers=api.headers("system"))
    assert response.status_code == 400 and json_of(response)["error"]["details"]["field"] == "organizationId"


def test_the_document_describes_each_field(api: Api) -> None:
    document = json_of(api.client.get("/openapi.json", headers=api.headers()))
    request = document["components"]["schemas"]["DispatchPolicyRequest"]
    assert request["required"] == ["weight", "ratePerSecond"]
    assert (
        request["properties"]["weight"]["maximum"] == 100 and request["properties"]["weight"]["description"]
    )
    assert request["properties"]["ratePerSecond"]["description"]
    paths = document["paths"]
    assert {"get", "put"} <= set(paths["/organizations/{organizationId}/dispatch"])
    assert "get" in paths["/organizations/dispatch"]
