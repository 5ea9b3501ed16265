"""The progress channel's protocol (rank -> supervisor), in one place. Schema: docs/channel.md.

One JSON object per Unix datagram, at most ``MAX_DATAGRAM`` bytes, on the abstract socket the
supervisor names in ``FORGELM_TUI_CHANNEL``. Version 1: every message has ``v``, ``rank``,
``kind`` and ``t``; unknown kinds and fields are ignored (a newer rank helper under an older
supervisor loses nothing that matters). Imported by both sides: stdlib only.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

CHANNEL_ENV = "FORGELM_TUI_CHANNEL"
VERSION = 1
MAX_DATAGRAM = 8192
# Where a rank is stuck (docs/channel.md): the supervisor reserves one real-time signal, names it
# to the ranks in STACKS_ENV (a supervisor that does not set it never receives a stacks_handler
# message), and sends it only to a rank that announced faulthandler on it: a real-time signal's
# default action ends the process. Not SIGRTMIN itself nor the first two after it (old
# LinuxThreads and some runtimes took those); never a forwarded signal (--forward-signals).
STACKS_SIGNAL = int(getattr(signal, "SIGRTMIN", 34)) + 3
STACKS_ENV = "FORGELM_TUI_STACKS_SIGNAL"


class MessageKind(StrEnum):
    PROGRESS = "progress"  # step, total, metrics: training moved on
    HEARTBEAT = "heartbeat"  # alive though silent
    STOP_REQUESTED = "stop_requested"  # a stop signal reached the rank (signal, via)
    STOPPED = "stopped"  # the rank left its loop at an agreed step (step, signal)
    STACKS_HANDLER = "stacks_handler"  # faulthandler dumps every thread on ``signum`` to ``file``
    COLLECTIVES = "collectives"  # how many collectives each process group entered
    OTHER = "other"  # a kind this version does not know (a newer helper): still a heartbeat


@dataclass(frozen=True)
class Message:
    """A decoded message; fields of the wrong type are dropped, not trusted."""

    rank: int
    kind: MessageKind
    at: float
    step: int | None = None
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    signal: str | None = None
    signum: int | None = None  # stacks_handler: the signal, the rank's pid, its main thread's
    pid: int | None = None  # ident (as faulthandler prints it) and the file it writes to
    thread: int | None = None
    file: str | None = None
    groups: dict[str, int] = field(default_factory=dict)  # collectives entered, per group


def stacks_file_name(rank: int) -> str:
    """A rank's stacks in the run dir: the supervisor's and the rank's side agree on it."""
    return f"rank-{rank}.stacks.txt"


def channel_name(run_id: str, token: str) -> str:
    """``@forgelm-tui-<run>-<token>``: ``@`` marks the abstract namespace (no file to clean)."""
    return f"@forgelm-tui-{run_id}-{token}"


def socket_address(name: str) -> str | bytes:
    """``@name`` is an abstract socket (no file, no path length limit); else a path."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def encode(rank: int, kind: MessageKind, **fields: Any) -> bytes:
    message = {"v": VERSION, "rank": rank, "kind": kind.value, "t": time.time(), **fields}
    return json.dumps(message, default=str).encode()[:MAX_DATAGRAM]


def decode(data: bytes) -> Message | None:
    """A message, or None for anything that is not one (bad JSON, no int rank)."""
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if not isinstance(raw, dict) or type(raw.get("rank")) is not int:
        return None
    try:
        kind = MessageKind(str(raw.get("kind")))
    except ValueError:
        kind = MessageKind.OTHER
    metrics = raw.get("metrics")
    return Message(
        rank=raw["rank"],
        kind=kind,
        at=_number(raw.get("t")) or 0.0,
        step=_int(raw.get("step")),
        total=_int(raw.get("total")),
        metrics={str(k): float(v) for k, v in metrics.items() if _number(v) is not None}
        if isinstance(metrics, dict) else {},
        signal=raw["signal"] if isinstance(raw.get("signal"), str) else None,
        signum=_int(raw.get("signum")),
        pid=_int(raw.get("pid")),
        thread=_int(raw.get("thread")),
        file=raw["file"] if isinstance(raw.get("file"), str) else None,
        groups=_groups(raw.get("groups")),
    )


def _groups(value: Any) -> dict[str, int]:
    """A collectives message's counts, an int per group; anything else is dropped."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if type(v) is int}


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None
