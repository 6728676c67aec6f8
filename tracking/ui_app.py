"""The app ``pretrain ui`` runs in ``mlflow server --app-name pretrain-ui``: MLflow's basic-auth app (every
request but the page's static files needs the password only the user who started it can read) with
artifact reads confined to the tracking root.

Authentication keeps other local users out; the confinement keeps a run out of files it should not
show even to its owner's browser: a run (or an experiment) whose artifact location is outside the
folder beside the tracking database, or a link inside that folder leading out of it, is refused with
403 before MLflow opens a file. Artifact routes this project has no use for (the proxied artifact
store, uploads, trace and logged-model artifacts, presigned URLs) are refused whole: fail closed. So is a
GraphQL request that names ``mlflowListArtifacts`` (it listed folders outside the root, past the REST check):
the UI browses a run's files through the REST route, which is confined.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

ARTIFACT_ROOT_ENV = "PRETRAIN_UI_ARTIFACT_ROOT"
"""The folder run artifacts must lie in (set by ``tracking.ui.serve``)."""
RUN_ARTIFACT_ROUTES = frozenset({"/get-artifact", "/api/2.0/mlflow/artifacts/list", "/ajax-api/2.0/mlflow/artifacts/list"})
"""The artifact routes the UI needs for a run's files, each naming the run (``run_id``/``run_uuid``)."""


def create_app():
    """MLflow's server app with basic authentication (its ``create_app`` makes the admin user from the
    config in ``MLFLOW_AUTH_CONFIG_PATH``), and the artifact check after authentication."""
    from mlflow.server import app
    from mlflow.server.auth import create_app as with_basic_auth

    served = with_basic_auth(app)  # registers the authentication check first: the confinement runs after it
    app.before_request(confine_artifacts)
    return served


def artifact_refusal(path: str, artifact_uri: str | None, requested: str, root: str) -> str:
    """Why the request for ``requested`` (a path inside a run's artifacts at ``artifact_uri``) on the route
    ``path`` is refused, or '' when the file it names lies inside ``root`` (links resolved)."""
    if path not in RUN_ARTIFACT_ROUTES:
        return "pretrain ui serves run artifacts only"
    if artifact_uri is None:
        return "no such run"
    parsed = urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        return "the run's artifacts are not on this machine"
    location = unquote(parsed.path) if parsed.scheme else artifact_uri
    target = os.path.realpath(os.path.join(location, requested.lstrip("/")))
    if not Path(target).is_relative_to(os.path.realpath(root)):
        return "the run's artifacts lie outside the tracking root"
    return ""


GRAPHQL_REFUSED = "listartifacts"
"""A GraphQL field (``mlflowListArtifacts``, matched without case) this UI refuses: it lists a run's artifacts."""


def graphql_refusal(query_args: dict[str, str], body: bytes) -> str:
    """Why a GraphQL request is refused, or '': every string it carries (query string, JSON body with its escapes
    decoded, or the raw body when it is not JSON) is searched for ``GRAPHQL_REFUSED``."""
    try:
        texts = [*query_args.values(), *_strings(json.loads(body))] if body else [*query_args.values()]
    except ValueError:
        texts = [*query_args.values(), body.decode("utf-8", "replace")]
    if any(GRAPHQL_REFUSED in text.lower() for text in texts):
        return "pretrain ui lists a run's artifacts through its REST route only"
    return ""


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def confine_artifacts():
    """Flask ``before_request``: a 403 for any artifact request that does not name a file inside the root, and
    for a GraphQL request that lists artifacts."""
    from flask import Response, request

    if request.path.rstrip("/").endswith("/graphql"):
        reason = graphql_refusal(dict(request.args), request.get_data(cache=True))
        return Response(f"refused: {reason}\n", status=403, mimetype="text/plain") if reason else None
    if "artifact" not in request.path:
        return None
    run_id = request.args.get("run_id") or request.args.get("run_uuid") or ""
    artifact_uri = None
    if run_id and request.path in RUN_ARTIFACT_ROUTES:
        from mlflow.exceptions import MlflowException
        from mlflow.server.handlers import _get_tracking_store

        try:
            artifact_uri = _get_tracking_store().get_run(run_id).info.artifact_uri
        except MlflowException:
            artifact_uri = None
    reason = artifact_refusal(request.path, artifact_uri, request.args.get("path", ""), os.environ[ARTIFACT_ROOT_ENV])
    return Response(f"refused: {reason}\n", status=403, mimetype="text/plain") if reason else None
