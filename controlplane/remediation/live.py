"""``pitstop policy explain`` against a running control plane: ``GET /v1/policies/explain`` over HTTP.

Lives outside ``controlplane.policy`` (which does no IO); the policy CLI imports it only when it is asked for
the live fleet.
"""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from controlplane.policy.explain import ExplainReport

DEFAULT_API_URL = "http://127.0.0.1:8000"


class LiveError(Exception):
    """The control plane could not be asked, or answered with an error; the message says which."""


def fetch_explain(api_url: str, token: str | None = None, *, client: httpx.Client | None = None,
                  timeout: float = 30.0) -> ExplainReport:
    """The control plane's dry run of every policy on the live fleet."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = api_url.rstrip("/") + "/v1/policies/explain"
    own = client is None
    http = client or httpx.Client(timeout=timeout)
    try:
        response = http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise LiveError(f"cannot reach {api_url}: {exc}") from exc
    finally:
        if own:
            http.close()
    if response.status_code != 200:
        raise LiveError(f"{url} answered {response.status_code}: {response.text[:500]}")
    try:
        return ExplainReport.model_validate_json(response.content)
    except ValidationError as exc:
        raise LiveError(f"{url} answered something that is not an explain report: {exc}") from exc
