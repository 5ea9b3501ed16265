"""What a training process imports to stop together with its peers and report progress.

    from forgelm_tui.rank import StopAgreement, report_progress

    with StopAgreement() as stop:
        for step in range(total):
            train_step()
            report_progress(step, total, {"loss": loss})
            if stop.should_stop(step):
                save_checkpoint()
                break

Adapters: ``forgelm_tui.rank.hf.StopTogetherCallback`` (transformers) and
``forgelm_tui.rank.lightning.StopTogetherCallback`` (Lightning), imported only where the library
is installed. ``forgelm_tui.rank.graceful`` runs a program so that SIGTERM becomes an exception.
"""


from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from forgelm_tui.rank.channel import CHANNEL_ENV, Channel, heartbeat, report_progress
    from forgelm_tui.rank.stop import StopAgreement

# Imported on first use (PEP 562): the runners (rank.observed, rank.graceful) are modules of this
# package, and a rank's start should not load the channel and the stop agreement it may never use.
_EXPORTS = {"CHANNEL_ENV": "channel", "Channel": "channel", "heartbeat": "channel",
            "report_progress": "channel", "StopAgreement": "stop"}
__all__ = ["CHANNEL_ENV", "Channel", "StopAgreement", "heartbeat", "report_progress"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
