"""The GPUs as the TUI shows them, folded from ``GpuSampled`` events (or a snapshot, and other
nodes' rank snapshots). Plain state, no Textual: :class:`RunModel` holds one as ``gpu``."""

from __future__ import annotations

from forgelm_tui.engine import events as ev


class GpuView:
    """This node's devices at the last sample and each rank's last GPU sample; ``seen`` once
    any came: only then does the table have GPU columns and the header a GPU line."""

    def __init__(self) -> None:
        self.devices: tuple[ev.GpuDevice, ...] = ()
        self.ranks: dict[int, ev.RankGpu] = {}
        self.seen = False

    def apply(self, event: ev.Event) -> None:
        if isinstance(event, ev.GpuSampled):
            self.devices = event.devices
            self.ranks.update((r.rank, r) for r in event.ranks)
            self.seen = True
        elif isinstance(event, ev.NodeChanged):
            for snap in event.ranks:
                if snap.gpu is not None:
                    self.ranks[snap.rank] = snap.gpu
                    self.seen = True

    def restore(self, snapshot: ev.RunSnapshot) -> None:
        self.devices = snapshot.gpus
        self.ranks = {r.rank: r.gpu for r in snapshot.ranks if r.gpu is not None}
        self.seen = bool(self.devices or self.ranks)
