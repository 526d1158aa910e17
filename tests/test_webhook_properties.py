"""Generated bad deliveries to the webhook receiver: a 4xx (or the documented 503) with one error line, never a
traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_watch import CATALOG

from flows.webhook import create_app
from pipelines.core.settings import Settings

PIN = "ab" * 20


def _prefect_down(name: str, commit: str) -> None:
    raise ConnectionError(f"Prefect is down ({name}@{commit})")  # what the receiver's own 503 is for


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    root = tmp_path_factory.mktemp("webhook")
    catalog = root / "registry" / "catalog.yaml"
    catalog.parent.mkdir(parents=True)
    catalog.write_text(CATALOG.format(pin=PIN, fixed="cd" * 20))
    s = Settings(home=root / "home", work_dir=root / "work", catalog_path=catalog, repo_dir=Path(root),
                 hf_endpoint="http://127.0.0.1:9")  # nothing listens: a history read is the documented 503
    return TestClient(create_app(s, "s3cret", dispatch=_prefect_down), raise_server_exceptions=False)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                     max_leaves=20)
_sha = st.one_of(st.text(max_size=45), st.just("a" * 40), st.just("A" * 40), st.integers(), st.none())
_event = st.fixed_dictionaries({
    "event": st.one_of(_json, st.fixed_dictionaries({"scope": st.sampled_from(["repo.content", "repo", "x"])})),
    "repo": st.one_of(_json, st.fixed_dictionaries({"name": st.sampled_from(["acme/tiny", "acme/x"]) | _json,
                                                    "type": st.sampled_from(["model", "dataset"]) | _json})),
    "updatedRefs": st.one_of(_json, st.lists(st.fixed_dictionaries({
        "ref": st.sampled_from(["refs/heads/main", "main", "refs/tags/v1"]) | _json, "newSha": _sha,
        "oldSha": _sha}), max_size=3)),
})
_bodies = st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()),
                    _event.map(lambda v: json.dumps(v).encode()),
                    st.integers(1, 5000).map(lambda n: b"[" * n * 40), st.integers(1, 5000).map(lambda n: b'{"a":' * n))
_headers = st.dictionaries(st.sampled_from(["x-webhook-secret", "content-type", "x-other"]),
                           st.sampled_from(["s3cret", "", "wrong", "application/json", "s3cret "]), max_size=3)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies, headers=_headers, secret=st.booleans())
def test_bad_deliveries_get_one_error_line(client: TestClient, caplog: pytest.LogCaptureFixture, body: bytes,
                                           headers: dict[str, str], secret: bool) -> None:
    if secret:
        headers = {**headers, "x-webhook-secret": "s3cret"}
    caplog.clear()
    with caplog.at_level(logging.INFO):
        answer = client.post("/", content=body, headers=headers)
    assert answer.status_code < 500 or answer.status_code == 503, (answer.status_code, answer.text)
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records), caplog.text
    reply = answer.json()
    if answer.status_code >= 400:
        assert isinstance(reply["error"], str) and reply["error"] and "\n" not in reply["error"], reply
    else:
        assert answer.status_code == 202 and ("ignored" in reply or "started" in reply), reply
