"""The rank's channel client when the supervisor's queue is full: nothing of where the rank is
gets lost (a CI run's envelope said step 18 of 20 for a rank that trained 20 steps)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from forgelm_tui.channel import Message, MessageKind, decode, socket_address
from forgelm_tui.rank import channel as client

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def receiver() -> Iterator[tuple[socket.socket, str]]:
    name = f"@forgelm-tui-test-{os.getpid()}-{os.urandom(4).hex()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(socket_address(name))
    sock.setblocking(False)
    yield sock, name
    sock.close()


def read_all(sock: socket.socket) -> list[Message]:
    found = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return found
        message = decode(data)
        assert message is not None
        found.append(message)


def full_queue(sock: socket.socket, channel: client.Channel) -> int:
    """Heartbeats until the receiver's queue is full; how many went in."""
    sent = 0
    while channel.flush() and sent < 10_000:
        channel.send(MessageKind.STOP_REQUESTED, signal="SIGUSR2", via="test")  # kept, in order
        sent += 1
    return sent


def test_a_full_queue_keeps_the_newest_progress_and_sends_it_first_next_time(
        receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch) -> None:
    sock, name = receiver
    monkeypatch.setattr(client, "install_stacks", lambda send: None)
    channel = client.Channel(name)
    queued = full_queue(sock, channel)
    assert queued >= 1
    for step in range(1, 21):
        channel.progress(step, 20, {"loss": 1.0 / step})
    channel.heartbeat()
    read = read_all(sock)  # the queue's, sent before it was full; the supervisor reads them
    assert len(read) == queued - 1  # the last stop report waits: the queue filled on it
    channel.send(MessageKind.STOPPED, step=20, signal="SIGTERM")  # the next send carries them
    after = read_all(sock)
    assert [m.kind for m in after] == [MessageKind.STOP_REQUESTED, MessageKind.PROGRESS,
                                       MessageKind.HEARTBEAT, MessageKind.STOPPED]
    assert (after[1].step, after[1].total) == (20, 20)  # only the newest progress waited
    assert channel.flush()


def test_at_exit_what_waits_is_tried_until_the_deadline_then_given_up(
        receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch) -> None:
    sock, name = receiver
    monkeypatch.setattr(client, "install_stacks", lambda send: None)
    channel = client.Channel(name)
    full_queue(sock, channel)
    channel.progress(5, 5)
    assert channel.flush_until(0.05) is False  # nobody reads: it gives up, it never raises
    read_all(sock)
    assert channel.flush_until(1.0) is True
    assert read_all(sock)[-1].step == 5


def test_nobody_listening_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "install_stacks", lambda send: None)
    channel = client.Channel(f"@forgelm-tui-test-nobody-{os.urandom(4).hex()}")
    channel.progress(1, 2)
    channel.heartbeat()
    assert channel.flush() and not channel._pending


def test_at_most_max_pending_wait(receiver: tuple[socket.socket, str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sock, name = receiver
    monkeypatch.setattr(client, "install_stacks", lambda send: None)
    channel = client.Channel(name)
    full_queue(sock, channel)
    for _ in range(client.MAX_PENDING * 2):
        channel.send(MessageKind.STOP_REQUESTED, signal="SIGTERM", via="test")
    assert len(channel._pending) == client.MAX_PENDING
