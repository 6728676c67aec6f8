"""Personal data and secrets: e-mail addresses, IP addresses, keys and tokens.

Each kind is redacted (every match replaced by a fixed placeholder: ``<EMAIL>``,
``<IP_ADDRESS>``, ``<SECRET>``), or makes its document dropped, or is left, per
``data.pii``. What is matched (docs/data.md has the reasons):

- **email**: ``local@domain.tld``, a letters-only top-level domain of 2+ characters (so a
  matrix product ``a@b.T`` is not one; ``x@self.weight`` is, a rare false positive in code).
- **ip**: IPv4 (four 0–255 octets, not inside a longer dotted run such as ``1.2.3.4.5``) and
  IPv6 (checked by ``ipaddress``), only globally routable addresses, as datatrove's
  PIIFormatter (``only_remove_public_ips``): private, loopback, link-local and documentation
  ranges are not personal. A four-part version number (``1.2.3.4``) is indistinguishable from
  an address, which is why ``ip`` is ``off`` by default.
- **secret**: AWS access key ids (``AKIA``/``ASIA`` + 16) and secret keys (40 characters after
  an ``aws_secret_access_key``-like name), PEM private key blocks (``-----BEGIN … PRIVATE
  KEY-----`` to its END line, or the header alone), GitHub (``ghp_``…, ``github_pat_``), Slack
  (``xox[abprs]-``), OpenAI-style (``sk-``) and Hugging Face (``hf_``) tokens, JSON Web Tokens
  (``eyJ….eyJ….…``) and ``.netrc`` entries (``machine H login U password P``, the keywords in any order,
  ``account`` and ``port`` too). A generic ``password = "..."`` is not
  matched: in code and documentation it is mostly an example, and redacting it would teach
  nothing while damaging much.
"""

from __future__ import annotations

import ipaddress
import re

from data_prep.config import PiiConfig, PiiMode

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP_ADDRESS>", "secret": "<SECRET>"}
KINDS = tuple(PLACEHOLDERS)

# E-mail: found from each "@" (Python source has many: decorators), its domain matched forward
# and its local part (at most 64 characters, RFC 5321) backward from a short window.
_EMAIL_DOMAIN = re.compile(r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,24}\b")
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9._%+-]{1,64}$")
# IP candidates start with a digit or hex digit, which the engine scans for quickly; boundaries,
# octet ranges and the address range are checked per candidate (``_global_ip``).
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_IPV6 = re.compile(r"(?:[0-9A-Fa-f]{1,4}|:)(?::[0-9A-Fa-f]{0,4}){2,7}")
_IP_EDGE = frozenset("0123456789abcdefABCDEF_.:" + "ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ")
# Secrets, each with a literal marker: a pattern runs only where its marker occurs (most
# documents hold none, and a marker test is a fast substring search).
_SECRETS = [
    (
        ("PRIVATE KEY",),
        # The whole block when its END line follows (within 20,000 characters), else the header alone.
        re.compile(
            r"-----BEGIN[A-Z ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
            r"(?:[\s\S]{0,20000}?-----END[A-Z ]{0,40} PRIVATE KEY(?: BLOCK)?-----)?"
        ),
    ),
    (("AKIA", "ASIA"), re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    (
        ("ecret", "ECRET"),
        re.compile(r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
    ),
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}\b|\bgithub_pat_[A-Za-z0-9_]{60,}"),
    ),
    (("xox",), re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    (("sk-",), re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{32,}")),
    # A JSON Web Token: three base64url parts, the first two JSON objects ("eyJ" is '{"').
    (("eyJ",), re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    # A .netrc entry (a file of them read from a home folder): machine (or default), then login, password,
    # account and port in any order, a password and a login or account among them (so that prose such as "the
    # machine learning password field" is not one).
    (
        ("password",),
        re.compile(
            r"\b(?:machine\s+\S+|default)"
            r"(?=(?:\s+(?:login|password|account|port)\s+\S+)*?\s+password\s+\S)"
            r"(?=(?:\s+(?:login|password|account|port)\s+\S+)*?\s+(?:login|account)\s+\S)"
            r"(?:\s+(?:login|password|account|port)\s+\S+){2,}"
        ),
    ),
    # A Hugging Face access token (``hf_`` and 34 letters), as HF_TOKEN holds it.
    (("hf_",), re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
]


def _global_ip(text: str, match: re.Match) -> bool:
    """A whole address (not part of a longer dotted or hex run), valid, and globally routable."""
    start, end = match.span()
    if (start and text[start - 1] in _IP_EDGE) or (end < len(text) and text[end] in _IP_EDGE):
        return False
    found = match.group()
    if ":" in found:
        # Python slices ("x[1::2]") make IPv6 shapes, some of them global: a real address in
        # text has 3+ groups or a group of 3+ digits ("fe80::1", "2001:db8::1").
        groups = [g for g in found.split(":") if g]
        if len(groups) < 3 and max(map(len, groups), default=0) < 3:
            return False
    try:
        return ipaddress.ip_address(found).is_global
    except ValueError:  # an octet over 255, a leading zero, not an IPv6 shape
        return False


def _splice(text: str, spans: list[tuple[int, int]], placeholder: str) -> str:
    pieces, at = [], 0
    for start, end in spans:
        pieces += [text[at:start], placeholder]
        at = end
    pieces.append(text[at:])
    return "".join(pieces)


def _email_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    at = text.find("@")
    while at >= 0:
        domain = _EMAIL_DOMAIN.match(text, at)
        if domain:
            local = _EMAIL_LOCAL.search(text, max(at - 64, spans[-1][1] if spans else 0), at)
            if local and (local.start() == 0 or text[local.start() - 1] not in "._%+-" and not text[local.start() - 1].isalnum()):
                spans.append((local.start(), domain.end()))
                at = text.find("@", domain.end())
                continue
        at = text.find("@", at + 1)
    return spans


def _find(kind: str, text: str) -> tuple[str, int]:
    """``text`` with ``kind`` redacted, and the number of matches."""
    if kind == "email":
        spans = _email_spans(text) if "@" in text else []
        return (_splice(text, spans, PLACEHOLDERS[kind]) if spans else text), len(spans)
    if kind == "ip":
        spans = [m.span() for m in _IPV4.finditer(text) if _global_ip(text, m)]
        if "::" in text or text.count(":") >= 7:
            spans += [m.span() for m in _IPV6.finditer(text) if _global_ip(text, m)]
            spans.sort()
        return (_splice(text, spans, PLACEHOLDERS[kind]) if spans else text), len(spans)
    count = 0
    for markers, pattern in _SECRETS:
        if any(m in text for m in markers):
            text, n = pattern.subn(PLACEHOLDERS[kind], text)
            count += n
    return text, count


def scrub(text: str, config: PiiConfig) -> tuple[str, str, dict[str, int]]:
    """The text with the kinds set to ``redact`` replaced, the drop reason
    (``pii_<kind>`` for the first kind set to ``drop`` found, else ``""``), and the
    redactions per kind (``pii_<kind>``: only those found)."""
    counts: dict[str, int] = {}
    for kind in KINDS:
        mode = getattr(config, kind)
        if mode == PiiMode.OFF:
            continue
        redacted, n = _find(kind, text)
        if not n:
            continue
        if mode == PiiMode.DROP:
            return text, f"pii_{kind}", {}
        text = redacted
        counts[f"pii_{kind}"] = n
    return text, "", counts


__all__ = ["KINDS", "PLACEHOLDERS", "scrub"]
