"""Local ports handed to servers the tests and the launcher start on 127.0.0.1."""

from __future__ import annotations

import socket

from common import net


def test_a_free_port_lies_below_the_ephemeral_range_and_binds():
    """A CI run lost ``pretrain ui``'s port ("address already in use") to an outgoing connection
    between free_port() and the server's bind: ports from the ephemeral range are handed to every
    connect(). free_port now draws below it."""
    low = net._ephemeral_low()
    ports = {net.free_port() for _ in range(50)}
    assert all(net.LOWEST_PORT <= port < low for port in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not one port for every caller
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_with_no_room_below_the_ephemeral_range_the_kernel_chooses(monkeypatch, tmp_path):
    (tmp_path / "range").write_text(f"{net.LOWEST_PORT + 10}\t60999\n")
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", tmp_path / "range")
    assert net.free_port() >= net.LOWEST_PORT + 10
