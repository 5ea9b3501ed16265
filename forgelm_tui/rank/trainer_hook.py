"""Give every HF ``Trainer`` of a program progress reports and heartbeats, the program unchanged.

The graceful runner (ForgeLM mode) calls :func:`install` before it runs the program, when
forgelm-tui names a progress channel. Nothing is imported here: when the program itself imports
``transformers.trainer`` (and only then, so the program keeps its own import order: ForgeLM sets
its offline variables before transformers reads them), a :class:`ProgressReportCallback`
(``forgelm_tui.rank.hf``) is appended to the module's ``DEFAULT_CALLBACKS``, the list every
``Trainer.__init__`` starts its callbacks from (transformers 4.x and 5.x). Each Trainer then
reports its steps on every rank and sends heartbeats while it evaluates and saves
(docs/progress.md). Any failure here leaves the program as it was, with a one-line note.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from forgelm_tui.channel import CHANNEL_ENV

TRAINER_MODULE = "transformers.trainer"


def install() -> bool:
    """Arrange for the callback to be added when the program imports the Trainer; True when
    arranged (under forgelm-tui, with a channel)."""
    if not os.environ.get(CHANNEL_ENV):
        return False
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        add_callback(module)
    elif not any(isinstance(f, _TrainerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TrainerFinder())
    return True


def add_callback(module: ModuleType) -> None:
    """Append the progress callback to the Trainer's default callbacks (once)."""
    try:
        from forgelm_tui.rank.hf import ProgressReportCallback

        defaults = module.DEFAULT_CALLBACKS
        if ProgressReportCallback not in defaults:
            defaults.append(ProgressReportCallback)
    except Exception as exc:  # a transformers without the list: progress from output only
        sys.stderr.write(f"forgelm-tui: no progress callback in transformers' Trainer ({exc})\n")


class _TrainerFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``transformers.trainer`` once, then leaves."""

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterLoad(spec.loader)
        return spec


class _AfterLoad(importlib.abc.Loader):
    """The module's own loader, then :func:`add_callback`; everything else is the loader's."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        add_callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename...: inspect, linecache
        return getattr(self._loader, name)
