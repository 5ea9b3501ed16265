"""rank.leave: the connections a leaving rank shuts down, and those it leaves alone."""

from __future__ import annotations

import os
import socket

import pytest

from forgelm_tui.rank import leave

pytestmark = pytest.mark.timeout(30)


def inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_shuts_down_the_named_connections_only_and_never_a_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        named = socket.create_connection(("127.0.0.1", port))
        named_peer, _ = listener.accept()
        other = socket.create_connection(("127.0.0.1", port))
        other_peer, _ = listener.accept()
        try:
            assert leave.shut_down({inode(named), inode(listener)}) == 1
            named_peer.settimeout(5)
            assert named_peer.recv(1) == b""  # the peer reads end-of-file at once
            assert named.fileno() >= 0  # the descriptor is still its owner's to close
            other.sendall(b"x")  # untouched
            other_peer.settimeout(5)
            assert other_peer.recv(1) == b"x"
            late = socket.create_connection(("127.0.0.1", port))  # the listener still accepts
            listener.settimeout(5)
            accepted, _ = listener.accept()
            late.close()
            accepted.close()
        finally:
            for sock in (named, named_peer, other, other_peer):
                sock.close()


def test_a_unix_socket_is_never_shut_down() -> None:
    one, two = socket.socketpair()
    with one, two:
        assert leave.shut_down({inode(one)}) == 0
        one.sendall(b"x")
        two.settimeout(5)
        assert two.recv(1) == b"x"


def test_a_gone_socket_and_an_empty_set_shut_nothing() -> None:
    sock = socket.socket()
    gone = inode(sock)
    sock.close()
    assert leave.shut_down({gone}) == 0
    assert leave.shut_down(set()) == 0


def test_leave_without_torch_distributed_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert leave.leave() == 0
