"""``pretrain ui``'s sign-in link without a server (``tracking.ui_login``, ``tracking.ui_app``): a token works once
and for minutes, a session for a day, neither is stored as it is, and the session cookie counts only on the UI's
own pages. ``tests/test_tracking.py`` signs a browser in through a real ``pretrain ui``."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from tracking.ui_app import from_own_pages
from tracking.ui_login import (
    SESSION_TTL_S,
    SESSIONS_DIR,
    TOKEN_TTL_S,
    TOKENS_DIR,
    forget_tokens,
    mint_token,
    open_session,
    redeem_token,
    session_open,
)

PAGE = "/#/experiments/1/runs/ab12?workflowType=machine_learning"
NOW = 1_800_000_000.0


def test_a_token_opens_its_page_once_and_only_within_its_minutes(tmp_path):
    token = mint_token(tmp_path, PAGE, now=NOW)
    assert len(token) >= 40 and redeem_token(tmp_path, "x" + token[1:], now=NOW) is None  # a guess
    assert redeem_token(tmp_path, token, now=NOW + 1) == PAGE
    assert redeem_token(tmp_path, token, now=NOW + 2) is None  # used: refused
    late = mint_token(tmp_path, PAGE, now=NOW)
    assert redeem_token(tmp_path, late, now=NOW + TOKEN_TTL_S + 1) is None  # expired: refused
    assert redeem_token(tmp_path, late, now=NOW) is None  # and gone
    assert list((tmp_path / TOKENS_DIR).iterdir()) == []
    for bad in ("", "x" * 10_000):
        assert redeem_token(tmp_path, bad, now=NOW) is None


def test_what_lies_on_disk_signs_nobody_in_and_is_the_users_alone(tmp_path):
    token, session = mint_token(tmp_path, PAGE, now=NOW), open_session(tmp_path, now=NOW)
    files = [*(tmp_path / TOKENS_DIR).iterdir(), *(tmp_path / SESSIONS_DIR).iterdir()]
    assert len(files) == 2 and all(token not in f.name + f.read_text() and session not in f.name + f.read_text() for f in files)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert all(stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o700 for d in (TOKENS_DIR, SESSIONS_DIR))
    # The file's name is the secret's hash: a session file's name is no session, a token's file no token.
    assert not session_open(tmp_path, files[1].name, now=NOW) and redeem_token(tmp_path, files[0].name, now=NOW) is None


def test_of_two_requests_with_one_token_one_signs_in(tmp_path):
    for _ in range(20):
        token = mint_token(tmp_path, PAGE, now=NOW)
        pages: list[str | None] = []

        def redeem(token: str = token, pages: list[str | None] = pages) -> None:
            pages.append(redeem_token(tmp_path, token, now=NOW))

        threads = [threading.Thread(target=redeem) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(pages, key=str) == [PAGE, None, None, None], pages


def test_a_session_lasts_its_day_and_a_token_leads_to_this_server_only(tmp_path):
    session = open_session(tmp_path, now=NOW)
    assert session_open(tmp_path, session, now=NOW + SESSION_TTL_S - 1)
    assert not session_open(tmp_path, session, now=NOW + SESSION_TTL_S + 1)
    assert not session_open(tmp_path, "", now=NOW) and not session_open(tmp_path, session[:-1], now=NOW)
    open_session(tmp_path, now=NOW + SESSION_TTL_S + 1)  # a new session removes the expired ones
    assert len(list((tmp_path / SESSIONS_DIR).iterdir())) == 1
    for page, opened in [("//elsewhere.example/x", "/"), ("https://elsewhere.example/", "/"), ("/", "/")]:
        assert redeem_token(tmp_path, mint_token(tmp_path, page, now=NOW), now=NOW) == opened


def test_a_start_forgets_the_links_of_the_one_before(tmp_path: Path):
    token = mint_token(tmp_path, PAGE, now=NOW)
    forget_tokens(tmp_path)
    assert redeem_token(tmp_path, token, now=NOW) is None
    forget_tokens(tmp_path / "never-made")  # nothing to forget: no error


def test_the_session_cookie_counts_on_the_uis_own_pages_only():
    """A cookie of 127.0.0.1 is sent with requests from pages of every port of it (another user's server too), and
    MLflow answers credentialed requests from any localhost origin: only the UI's own pages, and the person's own
    navigation, may use it."""
    own = "http://127.0.0.1:5000/"
    assert from_own_pages({}, own)  # a browser sending neither header: its own navigation
    assert from_own_pages({"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:5000"}, own)
    assert from_own_pages({"Sec-Fetch-Site": "none"}, own)  # typed, or opened from a terminal
    for headers in (
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8000"},  # another port of 127.0.0.1
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://127.0.0.1:8000"},  # a browser without Sec-Fetch-Site
        {"Origin": "null"},
    ):
        assert not from_own_pages(headers, own), headers
