"""Leave this rank's gloo process groups for real, so that no peer waits on it in a collective.

A gloo peer waiting in a collective this rank will never enter (it left its loop on SIGTERM)
fails only when this rank's connections to it close. ``destroy_process_group`` closes them only
when nothing else holds the group, and a ``DistributedDataParallel`` model does (its reducer):
then they close when this process ends, after its cleanup and the interpreter's teardown, which
on a loaded node outlasts the grace (seen on the real SLURM cluster at a time limit: three
ForgeLM ranks SIGKILLed in DDP's ``all_reduce``). torch 2.13 has no call that closes them:
``ProcessGroupGloo.abort()`` and ``_abort_process_group`` leave them open too.

So the graceful runner records which sockets each gloo group opened (the sockets that appeared
while torch created the group: ``_new_process_group_helper``, which every ``init_process_group``
and ``new_group`` goes through, connects gloo's full mesh before it returns), and when the rank
leaves it shuts those connections down (``shutdown(SHUT_RDWR)``: the peers read end-of-file,
their collective fails "Connection closed by peer", exactly as when this process ends). The
file descriptors stay gloo's, valid and closed by gloo later. Gloo's listening socket is left
alone (gloo aborts the process when its ``accept`` fails). Not covered: gloo with
``TORCH_GLOO_LAZY_INIT=1`` (connections made at the first collective), and groups with a
backend other than gloo alone (an NCCL communicator's bootstrap sockets must not be touched).

Nothing here may change the program's outcome: any error leaves the group as it was.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from forgelm_tui.rank.collectives import AfterImport

C10D = "torch.distributed.distributed_c10d"
HELPER = "_new_process_group_helper"

_opened: set[int] = set()  # inodes of the sockets gloo groups opened


def install() -> None:
    """Record gloo groups' sockets from now on (once torch.distributed is imported)."""
    if C10D in sys.modules:
        _wrap()
    elif not any(isinstance(f, AfterImport) and f.name == C10D for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(C10D, _wrap))


def leave() -> int:
    """Destroy the process groups when the default one is gloo and shut down the connections
    gloo groups opened; the number shut down."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return 0
    with contextlib.suppress(Exception):  # best effort: the stop goes on regardless
        if not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"):
            return 0
        dist.destroy_process_group()
    return shut_down(_opened)


def _wrap() -> None:
    c10d = sys.modules.get(C10D)
    helper = getattr(c10d, HELPER, None)
    if helper is None or getattr(helper, "_forgelm_tui", False):
        return
    recording = _recording(helper)
    recording._forgelm_tui = True  # type: ignore[attr-defined]
    setattr(c10d, HELPER, recording)


def _recording(helper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(helper)
    def new_process_group(*args: Any, **kwargs: Any) -> Any:
        before = socket_inodes()
        made = helper(*args, **kwargs)
        with contextlib.suppress(Exception):  # never the program's problem
            group = made[0] if isinstance(made, tuple) else made
            if sys.modules["torch.distributed"].get_backend(group) == "gloo":
                _opened.update(set(socket_inodes()) - set(before))
        return made

    return new_process_group


def socket_inodes() -> dict[int, int]:
    """This process's sockets: inode -> a file descriptor of it."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if link.startswith("socket:["):
                    found[int(link[8:-1])] = int(name)
    return found


def shut_down(inodes: set[int]) -> int:
    """Shut down the connected TCP sockets among ``inodes`` (never a listening one, nor one of
    another kind that appeared meanwhile: the channel's); how many."""
    count = 0
    for inode, fd in socket_inodes().items():
        if inode not in inodes:
            continue
        with contextlib.suppress(OSError):
            own = os.dup(fd)  # gloo may close fd meanwhile: checked by inode below
            with socket.socket(fileno=own) as sock:
                if os.fstat(own).st_ino != inode or sock.type != socket.SOCK_STREAM or \
                        sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                sock.getpeername()  # a listening socket has no peer: OSError, left alone
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
    return count
