"""What a launcher's command becomes under forgelm-tui (plan/prefix.py): forgelm-tui's own
torchrun-compatible words, and what the launcher would have given its ranks besides."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from forgelm_tui.plan.options import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Translated:
    """A launcher's command as forgelm-tui runs it (docs/launchers.md)."""

    launcher: str  # deepspeed | accelerate launch
    words: list[str]  # forgelm-tui options (torchrun's spellings), then the program and its args
    env: dict[str, str] = field(default_factory=dict)  # what the launcher adds for every rank
    env_style: str = "torchrun"  # LaunchSpec.env_style: torchrun | deepspeed | single
    local_rank_arg: bool = False  # deepspeed's --local_rank=N after the script
    notices: list[str] = field(default_factory=list)  # one line each, before the launch


@contextlib.contextmanager
def parser_errors(launcher: str) -> Iterator[None]:
    """A launcher's own argparse parser refuses in one line (forgelm-tui's exit 1, an
    envelope), never by printing its usage and exiting 2 itself."""
    def error(self: argparse.ArgumentParser, message: str) -> None:
        raise UsageError(f"{launcher}: {message}")

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def launcher_call(launcher: str, call: Callable[[], T]) -> T:
    """One of the launcher's own functions; what it raises for bad input is one line."""
    try:
        return call()
    except UsageError:
        raise
    except Exception as exc:  # its validation's refusals: a bad config file (YAML, a wrong
        # type), an unreadable hostfile, an assertion; whatever they are, one line
        text = str(exc).strip()
        message = text.splitlines()[0] if text else type(exc).__name__
        if not isinstance(exc, (ValueError, AssertionError, RuntimeError)):
            message = f"{type(exc).__name__}: {message}"
        raise UsageError(f"{launcher}: {message}") from None


def one_node(launcher: str, words: list[str], how: str) -> tuple[list[str], list[str]]:
    """A one-machine command stays one machine, as under its launcher, even inside a
    multi-node srun step (forgelm-tui alone would make the step's nodes one run): the words
    say ``--nnodes 1``, and a line says what the step's other nodes do (``how``: the
    launcher's own multi-node form)."""
    nodes = os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    notices = []
    if "SLURM_STEP_ID" in os.environ and nodes.isdigit() and int(nodes) > 1:
        notices.append(f"{launcher} on one machine in a {nodes}-node SLURM step: each node runs "
                       f"a job of its own, as under {launcher}; for one job across the nodes "
                       f"give {how}")
    return ["--nnodes", "1", *words], notices


def program_words(launcher: str, module: bool, no_python: bool) -> list[str]:
    """The launcher's module / no-python flags as forgelm-tui's (torchrun's) words."""
    if module and no_python:
        raise UsageError(f"{launcher}: --module and --no_python cannot be used together")
    return ["-m"] if module else ["--no-python"] if no_python else []


def missing(package: str, extra: str) -> UsageError:
    return UsageError(f"{package} is not installed for {sys.executable}: "
                      f"pip install '{extra}'")
