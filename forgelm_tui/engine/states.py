"""The small vocabularies events are made of (a rank's state, a stream, why a signal was sent,
what progress proves), kept apart from events.py, which re-exports them: ``events.RankState``."""

from __future__ import annotations

from enum import StrEnum


class Stream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


class RankState(StrEnum):
    """Decided once, in the engine (``RankRecord.state``); views only show it."""

    STARTING = "starting"
    RUNNING = "running"
    QUIET = "quiet"  # alive, no progress (as its evidence counts it) for the quiet threshold
    STOPPING = "stopping"  # the supervisor sent it the SIGTERM of a stop
    EXITED = "exited"  # ended with an exit code that is no failure of its own
    KILLED = "killed"  # ended by a signal
    FAILED = "failed"  # ended on its own with a code outside the outcome set


class Purpose(StrEnum):
    """Why the supervisor sent a signal to a rank."""

    STOP = "stop"  # SIGTERM of a coordinated stop
    KILL = "kill"  # SIGKILL at the grace deadline or on an escalation
    FORWARD = "forward"  # passed on without stopping anything (SIGUSR1 / SIGUSR2)
    CLEANUP = "cleanup"  # SIGKILL to processes left in the rank's group after it exited
    STACKS = "stacks"  # the reserved signal: the rank's faulthandler writes its stacks

    @property
    def stops(self) -> bool:
        """A stop or kill signal: the rank did not end on its own after it."""
        return self in (Purpose.STOP, Purpose.KILL)


class ProgressSource(StrEnum):
    CHANNEL = "channel"  # the rank reports through forgelm_tui.rank
    OUTPUT = "output"  # read from progress lines in its output


class ProgressEvidence(StrEnum):
    """The strongest kind of progress a rank has shown so far; only that kind (and its main
    thread's heartbeats) counts as its progress from then on (``RankRecord.saw``, SPEC §4)."""

    STEPS = "steps"  # it reported training steps (channel, or its training progress bar)
    OUTPUT = "output"  # it printed
    CPU = "cpu"  # its CPU time grew: the weak signal (a spinning hang burns CPU too)
