"""What the session adds to the engine's run (its multi-node part, the view): one object."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from forgelm_tui.engine.node_summary import NOTHING, Watch
from forgelm_tui.engine.records import CancelSource


@dataclass
class Hooks:
    """What the session adds to the engine's run: one object, given to every attempt's
    supervisor at construction, filled by the session's parts before the run starts."""

    # Multi-node (SPEC §8): awaited before any rank starts (the join), and told when this
    # node's own ranks are over (the node publishes its records) while other nodes run on.
    before_launch: Callable[[], Awaitable[None]] | None = None
    local_done: Callable[[], None] = lambda: None
    # A view that knows the terminal may name what a SIGHUP stood for (a closed terminal).
    hangup_origin: Callable[[], tuple[CancelSource, str] | None] = lambda: None
    # Multi-node: what the views here show of other nodes (the TUI, attached viewers): their
    # rows, and the ranks of the nodes they opened; only those travel (cluster/views.py).
    watching: Callable[[], Watch] = lambda: NOTHING
