"""Local ports: for a launch's rendezvous, the S3 server and the tracking server on 127.0.0.1."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

# Ports below the kernel's ephemeral range: a port from inside it can be taken, between asking and
# binding, by any outgoing connection's local end (a CI run once lost `pretrain ui`'s port so).
LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the moment of asking (the caller binds it soon after),
    drawn at random below the ephemeral range so that no outgoing connection takes it meanwhile."""
    high = _ephemeral_low()
    if high - LOWEST_PORT >= 1000:
        for _ in range(200):
            port = LOWEST_PORT + secrets.randbelow(high - LOWEST_PORT)
            if bindable(port):
                return port
    with socket.socket() as s:  # no room below the ephemeral range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
