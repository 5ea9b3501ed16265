"""Slow training steps for the real ForgeLM in long tests: with ``FORGELM_TEST_STEP_SECONDS``
set, every ``transformers.Trainer.training_step`` first waits that long, as a step waits on a
GPU, so a two-minute run does not burn two minutes of the test machine's CPU. Put this
directory on ``PYTHONPATH``; Python imports ``sitecustomize`` at its start. Nothing else of
ForgeLM, TRL or transformers changes: the wait is inside the step, where a scheduler's signal
finds a real run."""

import os
import sys

SECONDS = float(os.environ.get("FORGELM_TEST_STEP_SECONDS") or 0)


class _SlowSteps:
    """A meta path finder that patches ``transformers.trainer`` once it is loaded."""

    target = "transformers.trainer"

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        others = [f for f in sys.meta_path if f is not self]
        spec = next((s for s in (f.find_spec(name, path, target) for f in others
                                 if hasattr(f, "find_spec")) if s is not None), None)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            step = module.Trainer.training_step

            def training_step(self, *args, **kwargs):
                import time

                time.sleep(SECONDS)
                return step(self, *args, **kwargs)

            module.Trainer.training_step = training_step

        spec.loader.exec_module = exec_module
        return spec


if SECONDS > 0:
    sys.meta_path.insert(0, _SlowSteps())
