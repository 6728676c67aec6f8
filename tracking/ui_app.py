"""The app ``pretrain ui`` runs in ``mlflow server --app-name pretrain-ui``: MLflow's basic-auth app (every
request but the page's static files needs the password only the user who started it can read, or a session
of a browser that signed in) with artifact reads confined to the tracking root.

A browser signs in with the link ``pretrain ui`` prints (``/login?token=…``, ``tracking.ui_login``): the token
works once, within minutes, and is traded for a session cookie (HttpOnly, SameSite=Strict) that this
server accepts from its own pages only (``from_own_pages``), in place of the password (``authenticate``, the
auth config's ``authorization_function``). No URL ever holds the password: MLflow's run page breaks on an
address with credentials in it, and an address is seen by more than its owner (history, screen, logs).

Authentication keeps other local users out; the confinement keeps a run out of files it should not
show even to its owner's browser: a run (or an experiment) whose artifact location is outside the
folder beside the tracking database, or a link inside that folder leading out of it, is refused with
403 before MLflow opens a file. Artifact routes this project has no use for (the proxied artifact
store, uploads, trace and logged-model artifacts, presigned URLs) are refused whole: fail closed. So is a
GraphQL request that names ``mlflowListArtifacts`` (it listed folders outside the root, past the REST check):
the UI browses a run's files through the REST route, which is confined.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from tracking.ui_login import SESSION_TTL_S, TOKEN_TTL_S, open_session, redeem_token, session_open

ARTIFACT_ROOT_ENV = "PRETRAIN_UI_ARTIFACT_ROOT"
"""The folder run artifacts must lie in (set by ``tracking.ui.serve``)."""
UI_FOLDER_ENV = "PRETRAIN_UI_FOLDER"
"""The UI's private folder, where sign-in tokens and sessions are recorded (set by ``tracking.ui.serve``)."""
COOKIE_ENV = "PRETRAIN_UI_COOKIE"
"""The session cookie's name (set by ``tracking.ui.serve``): a name per port, as a browser keeps one cookie per
name for every port of 127.0.0.1 and two ``pretrain ui`` on two ports would sign each other's browser out."""
UI_USER = "pretrain"
"""The UI's one user, its admin: a signed-in browser acts as it; scripts send it with the password."""
SIGN_IN_PATH = "/login"
AUTHORIZATION_FUNCTION = "tracking.ui_app:authenticate"
"""``authenticate``, as MLflow's auth config names the function it asks who sent a request."""
OWN_PAGE_FETCHES = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` of a request the session cookie may sign in: from the UI's own pages, or one the person
made (an address typed or opened from a terminal)."""
RUN_ARTIFACT_ROUTES = frozenset({"/get-artifact", "/api/2.0/mlflow/artifacts/list", "/ajax-api/2.0/mlflow/artifacts/list"})
"""The artifact routes the UI needs for a run's files, each naming the run (``run_id``/``run_uuid``)."""


def create_app():
    """MLflow's server app with basic authentication (its ``create_app`` makes the admin user from the
    config in ``MLFLOW_AUTH_CONFIG_PATH``), the sign-in link before it, and the artifact check after it."""
    from mlflow.server import app
    from mlflow.server.auth import create_app as with_basic_auth

    app.before_request(sign_in)  # before MLflow's check: the link is how a browser without a password gets in
    served = with_basic_auth(app)  # registers the authentication check: the confinement runs after it
    app.before_request(confine_artifacts)
    return served


def from_own_pages(headers: Mapping[str, str], host_url: str) -> bool:
    """Whether a request with ``headers`` to the server at ``host_url`` comes from the UI's own pages or from the
    person, not from a page of another origin. A cookie of 127.0.0.1 goes with requests to every port of it from
    pages of every port (SameSite counts all of 127.0.0.1 one site), and MLflow answers credentialed requests
    from any localhost origin: without this check a page another user serves on 127.0.0.1 could read the runs."""
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in OWN_PAGE_FETCHES:
        return False
    origin = headers.get("Origin")  # browsers without Sec-Fetch-Site still send it on cross-origin requests
    return origin is None or origin == host_url.rstrip("/")


def _signed_in() -> bool:
    """Whether the current request carries the session cookie of a signed-in browser, from the UI's own pages."""
    from flask import request

    session = request.cookies.get(os.environ[COOKIE_ENV], "")
    return bool(session) and from_own_pages(request.headers, request.host_url) and session_open(_folder(), session)


def _folder() -> Path:
    return Path(os.environ[UI_FOLDER_ENV])


NOT_SIGNED_IN = (
    "Not signed in to pretrain ui: open the link `pretrain ui` printed (it works once; run `pretrain ui` again for a "
    f"new one), or send the user '{UI_USER}' and the password in the file it names (HTTP basic authentication).\n"
)


def authenticate():
    """MLflow's ``authorization_function``: the UI's user for a request of a signed-in browser, else MLflow's basic
    authentication (scripts, API clients), whose refusal says how to sign in. MLflow asks it for the requests
    of its Flask routes and, through a Flask request made from the same headers, of its FastAPI ones."""
    from mlflow.server.auth import authenticate_request_basic_auth
    from werkzeug.datastructures import Authorization

    if _signed_in():
        return Authorization("basic", {"username": UI_USER})
    answer = authenticate_request_basic_auth()
    if getattr(answer, "status_code", None) == 401:
        answer.set_data(NOT_SIGNED_IN)
    return answer


def _html_page(title: str, body: str, status: int, head: str = ""):
    from flask import Response

    text = f'<!doctype html>\n<html><head><meta charset="utf-8">{head}<title>{title}</title></head>\n<body>{body}</body></html>\n'
    response = Response(text, status=status, mimetype="text/html")
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"  # the address holds the token
    return response


def opening_page(page: str):
    """The answer to a sign-in link that worked: a page that opens ``page`` (an HTML redirect, not an HTTP
    one: a browser sends a SameSite=Strict cookie along a redirect only when the whole chain is same-site, and
    a link clicked in another site's page, a chat, a web terminal, starts a cross-site one)."""
    target = html.escape(page, quote=True)
    head = f'<meta http-equiv="refresh" content="0; url={target}">'
    return _html_page("pretrain ui", f'<p>Signed in: opening <a href="{target}">the MLflow UI</a>.</p>', 200, head)


def refused_page(signed_in: bool):
    """The answer to a sign-in link that was used already, expired, or never made here (403)."""
    body = (
        "<h1>This sign-in link does not work any more</h1>\n"
        f"<p>A link <code>pretrain ui</code> prints signs one browser in, once, within {TOKEN_TTL_S / 60:g} minutes. "
        "This one was used already, has expired, or belongs to an earlier start of <code>pretrain ui</code>.</p>\n"
        "<p>Run <code>pretrain ui</code> again and open the link it prints.</p>\n"
    )
    if signed_in:
        body += '<p>This browser is signed in already: <a href="/">open the MLflow UI</a>.</p>\n'
    return _html_page("pretrain ui: sign-in link refused", body, 403)


def sign_in():
    """Flask ``before_request``, ahead of MLflow's authentication: ``GET /login?token=…`` with a token that works
    opens a session (its cookie: HttpOnly, SameSite=Strict, for ``SESSION_TTL_S``) and the page the token leads to;
    any other token gets ``refused_page``. Other paths pass on to MLflow's authentication."""
    from flask import Response, request

    if request.path != SIGN_IN_PATH:
        return None
    if request.method != "GET":  # a link preview's HEAD must not spend the token
        return Response("refused: open the sign-in link in a browser\n", 405, {"Allow": "GET"}, mimetype="text/plain")
    page = redeem_token(_folder(), request.args.get("token", ""))
    if page is None:
        return refused_page(_signed_in())
    response = opening_page(page)
    session = open_session(_folder())
    response.set_cookie(os.environ[COOKIE_ENV], session, max_age=int(SESSION_TTL_S), path="/", httponly=True, samesite="Strict")
    return response


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
