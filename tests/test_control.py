"""Attach's run side (SPEC §9): every run serves a snapshot, then its events, on a 0600 Unix
socket, and takes commands recorded with who sent them; no viewer can slow or stop the run."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import rank_script, ready_pids, run_cli, start, wait_for

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.engine import events as ev

pytestmark = pytest.mark.timeout(90)

SLEEPER = rank_script("sleeper.py")


def connect(run_dir: Path, **options: str) -> ControlClient:
    """A viewer, once the run listens (its socket file is bound a moment before it listens)."""
    sock = run_dir / "control.sock"

    def attempt() -> ControlClient | None:
        if not sock.exists():
            return None
        try:
            return ControlClient(sock, **options)
        except ControlError as exc:
            if "Connection refused" in str(exc):
                return None
            raise

    return wait_for(attempt, 30, "the control socket")


def state_env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}


def until_verdict(client: ControlClient) -> list[object]:
    items: list[object] = []
    while not any(isinstance(i, ev.VerdictReached) for i in items):
        items.append(client.next_item())
    return items


def test_snapshot_events_and_a_cancel_from_a_viewer(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path, env=state_env(tmp_path))
    ready_pids(marks, 2)
    client = connect(run.run_dir)
    assert stat.S_IMODE((run.run_dir / "control.sock").stat().st_mode) == 0o600
    snapshot = client.next_item()
    assert isinstance(snapshot, ev.RunSnapshot)
    assert [r.rank for r in snapshot.ranks] == [0, 1] and all(r.pid for r in snapshot.ranks)
    client.send("forward", signal="SIGUSR1")
    wait_for(lambda: all((marks / f"got-SIGUSR1-{r}").exists() for r in range(2)), 20,
             "SIGUSR1 at both ranks")
    client.send("cancel")
    items = until_verdict(client)
    acks = [i for i in items if isinstance(i, dict) and i.get("type") == "ack"]
    assert acks == [{"type": "ack", "command": "forward", "effect": "forwarded SIGUSR1"},
                    {"type": "ack", "command": "cancel", "effect": "stop"}]
    assert any(isinstance(i, ev.RunStopping) for i in items)
    assert run.wait(30) == 2
    cancel = run.envelope()["cancel_requests"][0]
    assert cancel["source"] == "viewer"
    assert cancel["by"] == f"attached viewer (pid {os.getpid()}, uid {os.getuid()}, terminal)"
    forward = run.envelope()["forwarded_signals"][0]
    assert forward["signal"] == "SIGUSR1" and forward["source"] == "viewer"
    assert forward["by"] == cancel["by"] and forward["ranks"] == [0, 1]
    client.close()
    assert not (run.run_dir / "control.sock").exists()  # gone with the run


def test_two_viewers_and_one_killed_mid_stream(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path, env=state_env(tmp_path))
    ready_pids(marks, 2)
    first, second, dropped = (connect(run.run_dir) for _ in range(3))
    dropped.sock.shutdown(socket.SHUT_RDWR)  # a viewer that dies abruptly
    dropped.close()
    for client in (first, second):
        assert isinstance(client.next_item(), ev.RunSnapshot)
    run.signal(signal.SIGTERM)
    first_items, second_items = until_verdict(first), until_verdict(second)
    assert [type(i) for i in first_items if not isinstance(i, ev.RankSampled)] == \
        [type(i) for i in second_items if not isinstance(i, ev.RankSampled)]
    assert run.wait(30) == 2


def test_a_viewer_that_never_reads_does_not_slow_the_run(tmp_path: Path) -> None:
    """A flood of output with a viewer that reads nothing: the run ends as without it. (10 MB,
    past the viewer's 4 MiB queue: it is resynchronised, maybe dropped, or still attached at
    the end; the drop itself: test_a_stuck_viewer_is_dropped_and_its_connection_closed.)"""
    env, gate = state_env(tmp_path), tmp_path / "go"
    run = start(["--nproc-per-node", "2", rank_script("gated_flood.py"), str(gate), "50000"],
                tmp_path, env=env,
                stdout=subprocess.DEVNULL)  # unread, a pipe would hold the exit 10 s
    stuck = connect(run.run_dir)  # reads its hello only, then nothing
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    t0 = time.monotonic()
    gate.touch()  # the flood begins with the viewer attached
    assert run.wait(60) == 0
    assert time.monotonic() - t0 < 50
    log = (run.run_dir / "rank-1.stdout.log").read_bytes()
    assert log.count(b"\n") == 50000 + 1  # nothing lost (and the "at the gate" line)
    stuck.close()


def test_a_run_dir_too_deep_for_a_socket_path(tmp_path: Path, marks: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    env = state_env(tmp_path)
    run = start(["--nproc-per-node", "1", SLEEPER, str(marks)], deep, env=env)
    ready_pids(marks, 1)
    entries = wait_for(lambda: list((tmp_path / "state" / "forgelm-tui" / "runs").glob("*.json")),
                       30, "the registry entry")
    import json

    entry = json.loads(entries[0].read_text())
    assert entry["run_dir"] == str(run.run_dir)
    path = Path(entry["socket"])
    assert len(str(path)) <= 107 and path.name.endswith(".sock")
    client = ControlClient(path)
    assert isinstance(client.next_item(), ev.RunSnapshot)
    client.send("kill")
    assert run.wait(30) == 2
    assert run.envelope()["cancel_requests"][0]["effect"] == "kill"
    client.close()


def test_nothing_listens_on_a_finished_run(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "1", rank_script("exit_with.py"), "0"], tmp_path,
                  env=state_env(tmp_path))
    assert run.proc.returncode == 0
    with pytest.raises(ControlError, match="no run answers"):
        ControlClient(run.run_dir / "control.sock")


def unix_connections(sock: Path) -> int:
    """Accepted connections on a socket's path (state 03 in /proc/net/unix)."""
    suffix = " " + str(sock) + "\n"
    with open("/proc/net/unix") as handle:
        return sum(1 for ln in handle if ln.endswith(suffix) and ln.split()[5] == "03")


def test_a_tail_viewer_gets_coalesced_output_and_counts_what_was_left_out(
        tmp_path: Path) -> None:
    """output "tail" in the viewer's hello: each rank's output at most ~10 times a second, at
    most TAIL_LINES lines a rank and tick, and every other line counted as skipped."""
    from forgelm_tui.control.tails import TAIL_LINES

    lines, gate = 50_000, tmp_path / "go"
    run = start(["--nproc-per-node", "2", rank_script("gated_flood.py"), str(gate), str(lines)],
                tmp_path, env=state_env(tmp_path), stdout=subprocess.DEVNULL)
    client = connect(run.run_dir, output="tail")
    ack = {"type": "ack", "command": "hello", "effect": "output tail"}
    wait_for(lambda: client.next_item() == ack, 10, "the ack of the viewer's hello")
    gate.touch()
    items = until_verdict(client)
    outputs = [i for i in items if isinstance(i, ev.RankOutput)]
    skipped = sum(i["lines"] for i in items if isinstance(i, dict) and i["type"] == "skipped")
    assert all(o.count <= TAIL_LINES for o in outputs)
    sent = sum(o.raw.count(b" line ") for o in outputs)
    # every flood line sent or counted (and the ranks' "at the gate" lines, when they came in
    # the same tick as the flood)
    assert 2 * lines <= sent + skipped <= 2 * lines + 2
    assert skipped > lines  # most of a flood is left out
    for rank in (0, 1):  # the last line of each rank is there (before the verdict)
        last = [o for o in outputs if o.rank == rank][-1]
        assert last.raw.endswith(f"r{rank:03d} line {lines - 1:09d} ".encode() + b"x" * 70)
    assert run.wait(30) == 0
    client.close()


def test_stacks_from_a_viewer(tmp_path: Path, marks: Path) -> None:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path, env=state_env(tmp_path))
    ready_pids(marks, 2)
    client = connect(run.run_dir)
    assert isinstance(client.next_item(), ev.RunSnapshot)
    client.send("stacks")
    ack, captured = None, None
    while captured is None:
        item = client.next_item()
        if isinstance(item, dict) and item.get("command") == "stacks":
            ack = item
        if isinstance(item, ev.StacksCaptured):
            captured = item
    assert ack == {"type": "ack", "command": "stacks", "effect": "capturing"}
    by = f"attached viewer (pid {os.getpid()}, uid {os.getuid()}, terminal)"
    assert captured.reason == f"requested by {by}"
    assert [r.rank for r in captured.ranks] == [0, 1]
    assert run.proc.poll() is None  # nothing stopped
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    client.close()


def test_a_stuck_viewer_is_dropped_and_its_connection_closed(tmp_path: Path) -> None:
    """A viewer that never reads is dropped once its queue overflows (past the resyncs), and
    its connection is closed then, while the run goes on (not when the supervisor exits)."""
    gate = tmp_path / "go"
    run = start(["--nproc-per-node", "2", rank_script("gated_flood.py"), str(gate), "150000",
                 "--then-wait"], tmp_path, env=state_env(tmp_path), stdout=subprocess.DEVNULL)
    sock = run.run_dir / "control.sock"
    stuck = connect(run.run_dir)  # reads its hello only, then nothing
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    wait_for(lambda: unix_connections(sock) == 1, 10, "the viewer's connection")
    gate.touch()
    wait_for(lambda: unix_connections(sock) == 0, 60, "the stuck viewer to be dropped")
    assert run.proc.poll() is None  # the run goes on
    fresh = ControlClient(sock)  # and serves others
    assert isinstance(fresh.next_item(), ev.RunSnapshot)
    for rank in (0, 1):  # the gate line and every flood line, whatever the viewer did
        log = run.run_dir / f"rank-{rank}.stdout.log"
        wait_for(lambda log=log: log.read_bytes().count(b"\n") == 150000 + 1, 60,
                 f"rank {rank}'s whole flood in its log", step=0.2)
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 2
    fresh.close()
    stuck.close()


def test_output_events_on_the_wire_are_what_the_codec_makes() -> None:
    """The server's fast path for output: the same message as the codec's, decoded the same."""
    import json

    from forgelm_tui.control.server import event_line, line
    from forgelm_tui.engine.codec import from_wire, to_wire

    for chunk in (ev.RankOutput(3, ev.Stream.STDERR, b"a \"quoted\" line\n\xff\x00 \\ end"),
                  ev.RankOutput(0, ev.Stream.STDOUT, b"x")):
        fast = event_line(chunk)
        assert json.loads(fast) == json.loads(line({"type": "event", "event": to_wire(chunk)}))
        assert fast.endswith(b"}}\n") and fast.count(b"\n") == 1
        assert from_wire(json.loads(fast)["event"]) == chunk


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hello", [{"type": "hello", "v": 1, "run_id": "r", "pid": 1},
                                   {"type": "snapshot"}])
def test_a_run_of_another_protocol_is_refused_in_one_line(tmp_path: Path,
                                                          hello: dict[str, object]) -> None:
    """A run started by another forgelm-tui (an event's wire form changed: the protocol's
    number did too) or something else on the socket: one line, no decoding of what follows."""
    import json
    import threading

    from forgelm_tui.control import PROTOCOL

    path = tmp_path / "control.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(json.dumps(hello).encode() + b"\n")
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(ControlError) as error:
            ControlClient(path, timeout=10)
        thread.join(10)
        assert not thread.is_alive()  # the client closed its end
    finally:
        server.close()
    message = str(error.value)
    assert "\n" not in message
    if hello["type"] == "hello":
        assert f"control protocol v1, this forgelm-tui v{PROTOCOL}" in message
    else:
        assert message.endswith("not a forgelm-tui control socket")


def test_a_late_viewer_gets_every_other_node_as_last_shown() -> None:
    """Multi-node: other nodes' ranks reach a view only when they change (cluster/views.py);
    a viewer that attaches later gets each node as it was last shown, after the snapshot,
    its ranks kept through a change of state alone (a node lost, done)."""
    import dataclasses
    import json

    from forgelm_tui.control.server import ControlServer
    from forgelm_tui.engine.codec import from_wire
    from forgelm_tui.engine.history import MetricSeries

    class Session:
        run_id = "r"

        def snapshot(self) -> ev.RunSnapshot:
            return ev.RunSnapshot("r", 4, ("x",), "/runs/x", 1.0, (), node_rank=0, nnodes=2)

        def subscribe(self, listener: object) -> None:
            pass

    server = ControlServer(Session())  # type: ignore[arg-type]
    rank = ev.RankSnapshot(2, 0, 1, 99, ev.RankState.RUNNING, 1.0, None, None, None, (), "hi",
                           None, 7, 10, {}, None, {})
    server.on_event(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (rank,), 2.0))
    server.on_event(ev.NodeChanged(1, "", ev.NodeState.LOST, (), 3.0))
    snapshot, node = (json.loads(data) for data in server.snapshot_lines())
    assert snapshot["type"] == "snapshot"
    shown = from_wire(node["event"])
    assert isinstance(shown, ev.NodeChanged)
    assert (shown.node_rank, shown.state, shown.host, shown.ranks) == (
        1, ev.NodeState.LOST, "b", (rank,))
    curve = (MetricSeries("loss", ((1, 2.0), (7, 1.5))),)
    server.on_event(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (
        dataclasses.replace(rank, metrics_history=curve),), 4.0))
    server.on_event(ev.NodeChanged(1, "b", ev.NodeState.RUNNING, (
        dataclasses.replace(rank, step=8),), 5.0))  # a view without its curve
    kept = from_wire(json.loads(server.snapshot_lines()[1])["event"])
    assert [(r.step, r.metrics_history) for r in kept.ranks] == [(8, curve)]


def test_a_viewer_says_which_nodes_it_shows_and_the_run_views_their_union() -> None:
    """``watch`` (docs/control.md): the nodes whose ranks an attached viewer shows; a viewer
    that never says shows every node's (an older viewer). Bad input gets an error line."""
    import json

    from forgelm_tui.control.server import ControlServer, Viewer
    from forgelm_tui.engine.node_summary import NOTHING, Watch

    class Session:
        run_id = "r"

        def snapshot(self) -> ev.RunSnapshot:
            return ev.RunSnapshot("r", 4, ("x",), "/runs/x", 1.0, ())

        def subscribe(self, listener: object) -> None:
            pass

    server = ControlServer(Session())  # type: ignore[arg-type]
    assert server.watching() == NOTHING
    one, two = Viewer(server, None, 1, 0), Viewer(server, None, 2, 0)  # type: ignore[arg-type]
    server.viewers.update({one, two})
    assert server.watching() == Watch(True, None)
    for viewer, nodes in ((one, [3]), (two, [5, 3])):
        server._command(viewer, json.dumps({"type": "watch", "nodes": nodes}).encode())
    assert server.watching() == Watch(True, frozenset({3, 5}))
    assert json.loads(two.queue[-1]) == {"type": "ack", "command": "watch",
                                         "effect": "2 node(s)"}
    for bad in ("3", [-1], [True], ["a"], list(range(5000))):
        server._command(one, json.dumps({"type": "watch", "nodes": bad}).encode())
        assert json.loads(one.queue[-1])["type"] == "error", bad
    assert server.watching() == Watch(True, frozenset({3, 5}))  # unchanged by bad input
    server._command(one, json.dumps({"type": "watch", "nodes": None}).encode())
    assert server.watching() == Watch(True, None)
