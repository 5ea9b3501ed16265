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

from forgelm_tui.rank.channel import CHANNEL_ENV, Channel, heartbeat, report_progress
from forgelm_tui.rank.stop import StopAgreement

__all__ = ["CHANNEL_ENV", "Channel", "StopAgreement", "heartbeat", "report_progress"]
