"""The demo's own options: which rank misbehaves, how and when. No torch import here."""

from __future__ import annotations

import argparse

_INT_OPTIONS = {
    "steps": (30, "training steps"),
    "fail_rank": (None, "this rank exits with --fail-code at --fail-step"),
    "fail_code": (2, "exit code of the failing rank"),
    "fail_step": (10, "step at which --fail-rank exits"),
    "hang_rank": (None, "this rank stops taking part at --hang-step: the others block in "
                        "the next collective"),
    "hang_step": (10, "step at which --hang-rank hangs"),
    "ignore_sigterm_rank": (None, "this rank ignores SIGTERM (needs the grace SIGKILL)"),
    "exit_code": (0, "code every rank exits with after the last step (4: awaiting approval)"),
}


def add_demo_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("demo options")
    for name, (default, text) in _INT_OPTIONS.items():
        group.add_argument(f"--{name.replace('_', '-')}", dest=f"demo_{name}", type=int,
                           default=default, metavar="N", help=text)
    group.add_argument("--fail-raise", dest="demo_fail_raise", action="store_true",
                       help="--fail-rank raises an exception instead (exit 1 with a traceback: "
                            "a crash, 2; the exception is named in the envelope)")
    group.add_argument("--step-time", dest="demo_step_time", type=float, default=0.2,
                       metavar="S", help="extra seconds per step, so there is time to watch")
    group.add_argument("--cleanup-seconds", dest="demo_cleanup_seconds", type=float,
                       default=0.0, metavar="S",
                       help="after a stop, each rank's cleanup (checkpoint write) takes S "
                            "seconds, printing its start and end: the graceful path made visible")


def demo_argv(ns: argparse.Namespace) -> list[str]:
    """The demo's options as the rank script receives them."""
    argv = []
    for name in (*_INT_OPTIONS, "step_time", "cleanup_seconds"):
        value = getattr(ns, f"demo_{name}")
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if ns.demo_fail_raise:
        argv.append("--fail-raise")
    return argv
