"""Plays torch's part for the NCCL flight recorder's dump pipe on a machine without NCCL (a
test double, imported by a rank script): what ProcessGroupNCCL does (its ``DumpPipe``,
torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp): with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` set,
it replaces ``<stem><rank>.pipe`` by a new FIFO, opens it read-only and non-blocking, and a
thread of its own (not the main thread: a hung main thread still dumps) reads it now and then;
whatever it reads starts a dump to ``<TORCH_FR_DUMP_TEMP_FILE or
TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`` (default ``/tmp/nccl_trace_rank_``), a pickle."""

import os
import pickle
import threading
import time


def start(rank: int) -> None:
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not stem:
        return
    dump = (os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
            or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "/tmp/nccl_trace_rank_")
    path = f"{stem}{rank}.pipe"
    if os.path.lexists(path):
        os.unlink(path)
    os.mkfifo(path, 0o666)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def monitor() -> None:
        while True:
            time.sleep(0.2)
            try:
                asked = os.read(fd, 128)
            except BlockingIOError:
                continue
            if asked:
                with open(f"{dump}{rank}", "wb") as out:
                    pickle.dump({"version": "2.10", "rank": rank, "entries": []}, out)

    threading.Thread(target=monitor, name="nccl-monitor-double", daemon=True).start()
