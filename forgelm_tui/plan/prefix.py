"""The launcher in front of which forgelm-tui is put: ``forgelm-tui [own options] torchrun ...``
(issue 26, first part; README "From your launcher").

The user's documented command, unchanged, behind the word ``forgelm-tui``: forgelm-tui's own
options go before the launcher's word, the launcher's options and the program after it.

- A launcher's word counts only as the first word after forgelm-tui's options, and only
  spelled as a command: ``torchrun``, ``accelerate launch``, ``accelerate-launch``,
  ``deepspeed`` (and its aliases ``deepspeed.pt``, ``ds``); ``python -m torch.distributed.run``
  (``accelerate.commands.launch``, ``deepspeed.launcher.runner``) where ``python`` is
  ``python``, ``python3``, ``python3.N`` or an absolute path to such an interpreter. A script
  that happens to be named ``torchrun`` is given as a path (``./torchrun``): then it is a
  script, as any other.
- ``--no-python`` before a launcher's word is refused (every rank would run a launcher of its
  own), as is one of forgelm-tui's own options after it (it would be the launcher's).
- torchrun's arguments are forgelm-tui's torchrun-compatible options: ``forgelm-tui torchrun
  ARGS`` plans as ``forgelm-tui ARGS``. ``deepspeed`` and ``accelerate launch`` are read by
  their own parsers and functions (plan/deepspeed_launch.py, plan/accelerate_launch.py) into
  the same options plus what those launchers give their ranks (plan/translated.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Sequence

from forgelm_tui.plan.options import UsageError
from forgelm_tui.plan.translated import Translated

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
OWN_GROUP = "forgelm-tui options"
# the launchers' console scripts (deepspeed's aliases: deepspeed.pt, ds) and modules
COMMANDS = {"torchrun": "torchrun", "accelerate-launch": "accelerate", "deepspeed": "deepspeed",
            "deepspeed.pt": "deepspeed", "ds": "deepspeed"}
MODULES = {"torch.distributed.run": "torchrun", "accelerate.commands.launch": "accelerate",
           "deepspeed.launcher.runner": "deepspeed"}


def python_word(word: str) -> bool:
    """``python``, ``python3``, ``python3.11``, or an absolute path to one of them."""
    name = os.path.basename(word)
    return bool(_PYTHON.fullmatch(name)) and (word == name or os.path.isabs(word))


def launcher_of(args: Sequence[str]) -> tuple[str, int] | None:
    """The launcher the target begins with and how many words name it, or None."""
    if not args:
        return None
    head, rest = args[0], list(args[1:3])
    if head == "accelerate" and rest[:1] == ["launch"]:
        return "accelerate", 2
    if head in COMMANDS:
        return COMMANDS[head], 1
    if python_word(head) and rest[:1] == ["-m"] and rest[1:] and rest[1] in MODULES:
        return MODULES[rest[1]], 3
    return None


def unwrap(options: list[str], target: Sequence[str], no_python: bool,
           parser: argparse.ArgumentParser) -> Translated | None:
    """The launcher's command as forgelm-tui runs it (forgelm-tui's own options first), or
    None when the target names no launcher."""
    found = launcher_of(target)
    if found is None:
        return None
    launcher, words = found
    spelled = " ".join(target[:words])
    if no_python:
        raise UsageError(f"--no-python {spelled}: every rank would run a launcher of its own; "
                         f"put forgelm-tui in front of it instead: forgelm-tui {spelled} ...")
    rest = list(target[words:])
    _no_own_options(rest, parser, spelled)
    if launcher != "torchrun":
        _own_options_only(options, parser, spelled)
    if launcher == "torchrun":
        translated = Translated("torchrun", rest)
    else:  # the launcher's own logging (deepspeed's logger writes to stdout) goes to stderr:
        # stdout is the envelope's with --output-format json
        with contextlib.redirect_stdout(sys.stderr):
            translated = _translate(launcher, rest)
    return dataclasses.replace(translated, words=[*options, *translated.words])


def _translate(launcher: str, rest: list[str]) -> Translated:
    if launcher == "deepspeed":
        from forgelm_tui.plan import deepspeed_launch

        return deepspeed_launch.translate(rest)
    from forgelm_tui.plan import accelerate_launch

    return accelerate_launch.translate(rest)


def _own_options_only(options: Sequence[str], parser: argparse.ArgumentParser,
                      spelled: str) -> None:
    """Before deepspeed or accelerate launch, forgelm-tui's own options only: the launcher's
    flags give the ranks and the rendezvous (a torchrun option there would be lost)."""
    own = _own(parser)
    for option in options:
        name = option.split("=", 1)[0]
        if name.startswith("-") and name not in own:
            raise UsageError(f"{name} before {spelled!r}: {spelled}'s own flags give the ranks "
                             "and the rendezvous; only forgelm-tui's own options go before it")


def _own(parser: argparse.ArgumentParser) -> set[str]:
    return {s for group in parser._action_groups if group.title == OWN_GROUP
            for action in group._group_actions for s in action.option_strings}


def _no_own_options(rest: Sequence[str], parser: argparse.ArgumentParser, spelled: str) -> None:
    """Up to the program (the first word that is no option nor an option's value)."""
    own = _own(parser)
    takes_value = {s: a.nargs != 0 for a in parser._actions for s in a.option_strings}
    index = 0
    while index < len(rest) and rest[index].startswith("-") and rest[index] != "--":
        name = rest[index].split("=", 1)[0]
        if name in own:
            raise UsageError(f"{name} is forgelm-tui's own option: put it before {spelled!r} "
                             f"(forgelm-tui {name} ... {spelled} ...)")
        index += 2 if takes_value.get(name) and "=" not in rest[index] else 1
