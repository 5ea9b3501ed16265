"""Stop together: every rank agrees, at the same step boundary, whether to stop.

The signal handler only records the request; nothing collective ever runs inside a handler
(a broadcast there pairs with another rank's gradient all-reduce and deadlocks, as Lightning
2.6.6 does). Every rank calls :meth:`StopAgreement.should_stop` at the same point of its loop;
one all-reduce (MAX) of a single integer decides for all: any rank's request stops every rank,
at the same step. Works on gloo and nccl, and without any process group (single process).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import Any

from forgelm_tui.channel import MessageKind
from forgelm_tui.rank.channel import Channel, default_channel
from forgelm_tui.signames import signal_name

Handler = Any  # what signal.getsignal returns


class StopAgreement:
    """Records stop signals; agrees across ranks when asked.

    ``every``: agree only on every k-th call (all ranks must call the same number of times).
    ``group``: the torch.distributed group to agree in (default: the world).
    """

    def __init__(
        self,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        *,
        every: int = 1,
        group: Any = None,
        channel: Channel | None = None,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.signals = tuple(signals)
        self.every = every
        self.group = group
        self.channel = channel or default_channel()
        self.requested_by: int | None = None  # the signal this rank received, if any
        self.requested_at: float | None = None
        self.reason: str | None = None
        self.stopped_at_step: int | None = None
        self._calls = 0
        self._agreed = False
        self._previous: dict[int, Handler] = {}

    # ------------------------------------------------------------- handlers

    def install(self) -> StopAgreement:
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopAgreement:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only record: this may run in the middle of anything, including a collective's setup.
        if self.requested_by is None:
            self.requested_by = signum
            self.requested_at = time.time()
            self.reason = signal_name(signum)
            self.channel.send(MessageKind.STOP_REQUESTED, signal=self.reason)

    def request(self, reason: str = "requested") -> None:
        """Ask every rank to stop at the next agreement (from code, not a signal)."""
        if self.reason is None:
            self.reason = reason
            self.requested_at = time.time()

    @property
    def requested(self) -> bool:
        return self.reason is not None

    # ------------------------------------------------------------- agreement

    def should_stop(self, step: int | None = None) -> bool:
        """True on every rank at the same call once any rank has asked to stop."""
        if self._agreed:
            return True
        self._calls += 1
        if self._calls % self.every:
            return False
        if _agree(1 if self.requested else 0, self.group):
            self._agreed = True
            self.stopped_at_step = step
            self.channel.send(MessageKind.STOPPED, step=step, signal=self.reason,
                              own_request=self.requested)
        return self._agreed


def _agree(local: int, group: Any) -> bool:
    """MAX of ``local`` over the group; the local value when there is no process group."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return bool(local)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return bool(local)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([local], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


class AgreementHolder:
    """What the library adapters share: a fresh :class:`StopAgreement` per training run,
    installed once when the run starts and restored when it ends."""

    def __init__(self, signals: Iterable[int], every: int) -> None:
        self.signals = tuple(signals)
        self.every = every
        self.stop = StopAgreement(self.signals, every=every)
        self._installed = False

    @property
    def stopped(self) -> bool:
        """True once the ranks agreed to stop (the last run did not go to the end)."""
        return self.stop.stopped_at_step is not None

    @property
    def stopped_at_step(self) -> int | None:
        return self.stop.stopped_at_step

    def take_over_signals(self) -> None:
        """Install a fresh agreement's handlers, unless this run already did."""
        if not self._installed:
            self.stop = StopAgreement(self.signals, every=self.every)
            self.stop.install()
            self._installed = True

    def restore_signals(self) -> None:
        """Put back the handlers that were there before. Idempotent."""
        if self._installed:
            self.stop.uninstall()
            self._installed = False
