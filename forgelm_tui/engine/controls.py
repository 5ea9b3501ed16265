"""What any controller can ask of a run, with one signature each: keys (the TUI), signals (the
supervisor's own handlers), viewers (the control socket, the browser), the attach viewer's
handle on the run it watches, and the engine itself. The run's session implements it once
(run.Session, onto the attempt's Supervisor); an attached viewer's handle sends it on the
socket. Who asked is ``origin`` and ``source``; what a request stands for (one cause, one stop)
is the policy's to decide (engine/policy.py), never the caller's."""

from __future__ import annotations

import signal
from typing import Protocol

from forgelm_tui.engine.records import CancelSource
from forgelm_tui.engine.signal_inbox import Sender


class Controls(Protocol):
    def request_cancel(self, origin: str = "operator", sig: int = signal.SIGINT, *,
                       source: CancelSource = CancelSource.OPERATOR,
                       sender: Sender | None = None) -> str:
        """Stop every rank gracefully; the effect: "stop", "kill" or "merged"."""
        ...

    def kill_now(self, origin: str = "operator",
                 source: CancelSource = CancelSource.OPERATOR) -> None:
        """SIGKILL every live rank now."""
        ...

    def forward(self, sig: int, origin: str | None = "operator",
                source: CancelSource = CancelSource.OPERATOR,
                sender: Sender | None = None) -> None:
        """``sig`` to every live rank's main process; nothing stops."""
        ...

    def request_stacks(self, origin: str = "operator") -> bool:
        """Every live rank's stacks, now; False while a capture is under way or none runs."""
        ...
