"""The real CLI in a real terminal (tmux): what an operator sees and presses."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import rank_script, wait_for
from tmux_terminal import Terminal

pytestmark = pytest.mark.timeout(120)

if shutil.which("tmux") is None:  # CI installs it (.ci/run); a bare dev machine may not have it
    pytestmark = [pytestmark, pytest.mark.skipif(not os.environ.get("CI"), reason="no tmux")]


def test_awaiting_approval_verdict_and_q(term: Terminal) -> None:
    term.start(["--nproc-per-node", "2", rank_script("exit_with.py"), "4", "--sleep", "2"])
    # the rank rows, not the header alone (a frame can show the header first)
    screen = term.wait_screen(r"(?sm)RUNNING.*^\s*1\s+1\s+\d+\s+running")
    assert re.search(r"^\s*0\s+0\s+\d+\s+running", screen, re.M)
    assert re.search(r"^\s*1\s+1\s+\d+\s+running", screen, re.M)
    term.wait_screen(r"exit 4 AWAITING_APPROVAL\s+model staged")
    term.press("s")
    term.wait_screen(r"Envelope saved to")
    saved = wait_for(lambda: list(term.tmp.glob("forgelm-tui-envelope-*.json")), 10, "the file")
    assert saved[0].read_bytes() == (term.tmp / "run" / "envelope.json").read_bytes()
    term.press("q")
    assert term.exit_code() == 4
    after = term.wait_screen(r"forgelm-tui: exit 4 EXIT_AWAITING_APPROVAL")
    assert "envelope.json" in after.replace("\n", "")


def test_the_demo_in_the_tui_ctrl_q_asks_then_cancels_with_its_cleanup(term: Terminal,
                                                                        tmp_path: Path) -> None:
    """The demo (real DDP ranks) in the TUI: ctrl+q mid-run asks first, "n" leaves it running;
    ctrl+q then "y" cancels: every rank runs its --cleanup-seconds cleanup, the verdict shows,
    and q leaves with 2. (The c key's cancel in a real terminal: the tests below; each key's
    rule: test_tui.py and test_tui_exits.py on a scripted run.)"""
    term.start(["demo", "--steps", "400", "--step-time", "0.2", "--cleanup-seconds", "1"])
    term.wait_screen(r"step \d+/400")
    term.press("C-q")
    term.wait_screen(r"Stop the run\?")
    term.press("n")
    wait_for(lambda: "Stop the run?" not in term.screen(), 30, "the question to close")
    term.wait_screen(r"RUNNING")  # (it was on screen behind the question too)
    assert not term.exit_file.exists()
    term.press("C-q")
    term.wait_screen(r"Stop the run\?")
    term.press("y")
    term.wait_screen(r"FINISHED.*exit 2 TRAINING_ERROR")
    term.wait_screen(r"rule 4: interrupted")
    term.press("q")
    assert term.exit_code() == 2
    envelope = term.envelope()
    assert envelope["cancelled"]["by"] == "operator"  # type: ignore[index]
    assert envelope["exit_code"] == 2
    for rank in range(2):
        log = (tmp_path / "run" / f"rank-{rank}.stdout.log").read_text()
        assert "cleanup started (1 s)" in log and "cleanup finished" in log, log[-500:]


def test_cancel_in_the_tui_on_node_1_stops_every_node(term: Terminal, tmp_path: Path) -> None:
    """Multi-node: the TUI on node 1 shows node 0's rank too (node column); its cancel stops
    both nodes; both exit 2 with the same stop."""
    from cluster_nodes import free_port_pair, start_nodes

    marks = tmp_path / "marks"
    marks.mkdir()
    port = free_port_pair()
    target = [rank_script("sleeper.py"), str(marks)]
    flags = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    node0 = start_nodes(2, target, tmp_path, port=port, ranks=[0])[0]
    term.start([*flags, "--node-rank", "1", *target])
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 60, "ranks ready")
    # rank, node, local rank: rank 0 is node 0's, known here from its heartbeats
    term.wait_screen(r"(?m)^\s*0\s+0\s+0\s+\d+\s+(running|quiet)", 20)
    term.wait_screen(r"(?m)^\s*1\s+1\s+0\s+\d+\s+(running|quiet)", 20)
    term.press("c")
    term.wait_screen(r"Stop the run\?")
    term.press("y")
    term.wait_screen(r"FINISHED.*exit 2 TRAINING_ERROR")
    assert node0.wait(30) == 2
    term.press("q")
    assert term.exit_code() == 2
    envelope = json.loads((tmp_path / "run" / "node-1" / "envelope.json").read_text())
    assert envelope["stop"]["origin_node"] == 1 and envelope["cancelled"]["by"] == "operator"
    assert node0.envelope()["stop"] == envelope["stop"]
    assert (marks / "got-SIGTERM-0").exists()


def test_cancel_with_rank_ignoring_sigterm_counts_down_and_kills(term: Terminal,
                                                                 tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    term.start(["--nproc-per-node", "2", "--grace", "3", rank_script("sleeper.py"), str(marks),
                "--ignore-term", "1"])
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 30, "ranks ready")
    term.wait_screen(r"RUNNING")
    term.press("c")
    term.wait_screen(r"Stop the run\?")
    term.press("y")
    term.wait_screen(r"STOPPING\s+SIGKILL in [1-3] s")
    term.wait_screen(r"rank 1: SIGKILL sent by forgelm-tui \(grace of 3 s ended\)")
    term.press("q")
    assert term.exit_code() == 2
    rank1 = term.envelope()["ranks"][1]  # type: ignore[index]
    term_at, kill_at = (s["at"] for s in rank1["signals_sent"][:2])
    from datetime import datetime

    gap = (datetime.fromisoformat(kill_at[:-1]) - datetime.fromisoformat(term_at[:-1]))
    assert 2.7 < gap.total_seconds() < 4.0


def _supervisor_pid(rank_pid: int) -> int:
    stat = Path(f"/proc/{rank_pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # state, ppid, ...


def test_sigterm_to_the_supervisor_restores_the_terminal(term: Terminal, tmp_path: Path) -> None:
    import signal

    marks = tmp_path / "marks"
    marks.mkdir()
    term.start(["--nproc-per-node", "2", rank_script("sleeper.py"), str(marks)])
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 30, "ranks ready")
    term.wait_screen(r"RUNNING")
    rank_pid = int((marks / "ready-0").read_text().split()[0])
    os.kill(_supervisor_pid(rank_pid), signal.SIGTERM)  # as a scheduler would
    assert term.exit_code() == 2  # nobody at the keyboard: the app closes once ranks are down
    screen = term.wait_screen(r"forgelm-tui: exit 2 EXIT_TRAINING_ERROR")
    assert "RUNNING" not in screen and "FINISHED" not in screen  # the TUI screen is gone
    envelope = term.envelope()
    assert envelope["cancelled"]["by"] == "SIGTERM to the supervisor"  # type: ignore[index]


@pytest.mark.fault("F23")
@pytest.mark.parametrize("when", ["running", "finished"])
def test_closed_terminal_stops_the_run_and_the_app(term: Terminal, tmp_path: Path,
                                                  when: str) -> None:
    from conftest import pid_alive

    marks = tmp_path / "marks"
    marks.mkdir()
    sleep = "3600" if when == "running" else "1"
    term.start(["--nproc-per-node", "2", "--grace", "3", rank_script("sleeper.py"), str(marks),
                "--sleep", sleep])
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 30, "ranks ready")
    ranks = [int((marks / f"ready-{r}").read_text().split()[0]) for r in range(2)]
    supervisor = _supervisor_pid(ranks[0])
    term.wait_screen(r"RUNNING" if when == "running" else r"exit 0 SUCCESS")
    term.close()  # the terminal goes away (ssh dropped, tmux killed)
    wait_for(lambda: not any(pid_alive(p) for p in [*ranks, supervisor]), 20,
             "the ranks and the supervisor to be gone")
    envelope = term.envelope()
    if when == "running":
        assert envelope["exit_code"] == 2
        assert envelope["cancelled"]["by"] in (  # type: ignore[index]
            "SIGHUP to the supervisor", "terminal closed (hang-up)")
    else:
        assert envelope["exit_code"] == 0


@pytest.mark.fault("F23")
def test_closed_terminal_is_one_graceful_stop_with_the_full_grace(term: Terminal,
                                                                 tmp_path: Path) -> None:
    """tmux kill-session mid-run, ranks whose SIGTERM cleanup takes 2.5 s (past two of the
    app's 1 s terminal checks), a 30 s grace: the SIGHUP and the lost terminal are one request;
    every cleanup ends, nothing is SIGKILLed. (That a hang-up never escalates is the policy's
    rule, test_policy.py; this checks the wiring, with torch-free ranks.)"""
    from conftest import pid_alive

    marks = tmp_path / "marks"
    marks.mkdir()
    term.start(["--nproc-per-node", "2", "--grace", "30", rank_script("slow_cleanup.py"),
                str(marks), "2.5"])
    logs = [tmp_path / "run" / f"rank-{r}.stdout.log" for r in range(2)]
    wait_for(lambda: all((marks / f"ready-{r}").exists() for r in range(2)), 30, "ranks ready")
    wait_for(lambda: all(p.exists() and "step 3" in p.read_text() for p in logs), 30,
             "both ranks working")
    term.wait_screen(r"RUNNING")
    pids = [int((marks / f"ready-{r}").read_text()) for r in range(2)]
    term.close()  # the terminal goes away: SIGHUP, then the terminal check sees it gone
    wait_for(lambda: not any(pid_alive(p) for p in pids), 30, "the ranks to end")
    wait_for(lambda: (tmp_path / "run" / "envelope.json").exists()
             and not term.envelope()["provisional"], 20, "the final envelope")
    envelope = term.envelope()
    assert envelope["exit_code"] == 2
    cancelled = envelope["cancelled"]
    assert cancelled["source"] == "terminal"  # type: ignore[index]
    assert cancelled["by"] == "terminal closed (hang-up)"  # type: ignore[index]
    effects = [r["effect"] for r in envelope["cancel_requests"]]  # type: ignore[union-attr]
    assert effects[0] == "stop" and "kill" not in effects, effects
    assert envelope["stop"]["killed_at"] is None  # type: ignore[index]
    for rank, log in zip(envelope["ranks"], logs, strict=True):  # type: ignore[call-overload]
        assert [s["signal"] for s in rank["signals_sent"]] == ["SIGTERM"], rank
        assert "cleanup finished" in log.read_text()


@pytest.mark.timeout(90)
def test_the_tui_answers_keys_during_a_flood_of_long_lines(term: Terminal) -> None:
    """2 ranks printing 60 KB lines as fast as they can: every key press (the log's follow
    toggle) changes the screen. How fast is bench's business (bench/key_latency.py: median
    within 200 ms on a quiet machine); a timing assert here failed on a loaded one."""
    term.start(["--nproc-per-node", "2", "--grace", "3", rank_script("wide_flood.py"),
                str(60 * 1024), "60"])
    term.wait_screen(r"RUNNING")
    term.wait_screen(r"\[rank \d\] r\d www")
    states = {"following": re.compile(r"log: all ranks · following"),
              "paused": re.compile(r"log: all ranks · paused")}

    def shown() -> str | None:
        screen = term.screen()
        return next((name for name, regex in states.items() if regex.search(screen)), None)

    for _ in range(6):
        before = wait_for(shown, 10, "the log title")
        term.press("f")
        wait_for(lambda: (now := shown()) is not None and now != before, 10,  # noqa: B023
                 "the title to change", step=0.02)
    term.press("c")
    term.wait_screen(r"Stop the run\?")
    term.press("y")
    term.wait_screen(r"exit 2")
    term.press("q")
    assert term.exit_code() == 2
