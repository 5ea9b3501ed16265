"""Rank program of the soak (bench/soak.py): deterministic output, then one fault.

argv: DIR. DIR/plan.json (written by the bench) holds, per rank: how many bytes of its stdout
and stderr streams to write (bench/ranks/soak_stream.py: numbered lines with a CRC, progress
``\\r`` updates, lines without a newline, binary bytes, long lines), a daemon to start, whether
SIGTERM is ignored, whether to wait at the gate, and the action that ends it:

  exit C      exit with code C            raise       an uncaught RuntimeError (exit 1)
  signal N    kill itself with signal N    hang        sleep until stopped
  flood       keep writing its stdout stream until stopped
  stop        SIGSTOP itself (only SIGKILL ends it)

Evidence, so the bench can check that no byte was lost whatever ended the rank:

- DIR/count-RANK: 16 bytes, mmap'ed (MAP_SHARED) and updated right after every ``os.write``
  returns: the bytes of stdout and stderr the kernel accepted so far. The page cache keeps it
  when the rank is SIGKILLed or dies of SIGSEGV.
- DIR/daemon-RANK: the daemon's pid. DIR/ready-RANK: "PID", once the planned output is written.

Gate: the bench holds DIR/gate (a FIFO) open and writes one byte per rank once every rank is
ready; a gated rank reads one byte before its action, so crashes, signals and rank 0's exit
happen together, after every planned byte is written. An ``early`` rank acts without waiting
(it fails while the others are still flooding). Nothing outlives 300 s.
"""

import json
import mmap
import os
import random
import resource
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import soak_stream

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])
with open(os.path.join(out_dir, "plan.json")) as handle:
    plan = json.load(handle)
me = plan["ranks"][rank]
SAFETY = time.monotonic() + 300.0
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSEGV & co.: no core files in the cwd
if me["ignore_term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

count_fd = os.open(os.path.join(out_dir, f"count-{rank}"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(count_fd, 16)
counts = mmap.mmap(count_fd, 16)
written = [0, 0]  # stdout, stderr


def put(stream: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(1 + stream, view)
        written[stream] += n
        struct.pack_into("<QQ", counts, 0, written[0], written[1])
        view = view[n:]


def atomic(name: str, text: str) -> None:
    path = os.path.join(out_dir, f"{name}-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def start_daemon(kind: str) -> int:
    """A process that leaves the rank's session: what trackers and loader daemons do."""
    if kind == "double_fork":
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execvp("sleep", ["sleep", "3600"])
            os.write(write_end, str(grandchild).encode())
            os._exit(0)
        os.close(write_end)
        os.waitpid(child, 0)
        pid = int(os.read(read_end, 32))
        os.close(read_end)
        return pid
    # "session": new session, output to /dev/null; "session_keeps_pipes": it holds the rank's
    # stdout and stderr pipes open after the rank ends (no EOF until it is gone).
    quiet = kind == "session"
    proc = subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL if quiet else None,
                            stderr=subprocess.DEVNULL if quiet else None)
    return proc.pid


def write_planned() -> Iterator[bytes]:
    """Both streams up to their planned sizes, interleaved, in chunks of random size; returns
    the rest of the stdout stream (a flooding rank goes on with it)."""
    keys = [soak_stream.stream_key(plan["seed"], plan["run"], rank, s, me["dense"] and s == "out")
            for s in ("out", "err")]
    sources = [soak_stream.records(key) for key in keys]
    left = [me["out"], me["err"]]
    chunker = random.Random(f"{keys[0]}/chunks")
    while left[0] > 0 or left[1] > 0:
        stream = 0 if chunker.random() * (left[0] + left[1]) < left[0] else 1
        target = chunker.choice((1, 100, 4096, 65536, 1 << 20))
        chunk = bytearray()
        while len(chunk) < target and len(chunk) < left[stream]:
            chunk += next(sources[stream])
        left[stream] -= len(chunk)
        put(stream, bytes(chunk))
    return sources[0]


def wait_gate() -> None:
    """One byte from the gate FIFO; exit 9 if the bench is gone or never opens it."""
    gate = os.open(os.path.join(out_dir, "gate"), os.O_RDONLY | os.O_NONBLOCK)
    while True:
        left = SAFETY - time.monotonic()
        if left <= 0 or not select.select([gate], [], [], left)[0]:
            os._exit(9)
        try:
            data = os.read(gate, 1)
        except BlockingIOError:
            continue  # another rank took the byte first
        if not data:
            os._exit(9)  # no writer: the bench is gone
        return


if me["daemon"]:
    atomic("daemon", str(start_daemon(me["daemon"])))
flood_source = write_planned()
atomic("ready", str(os.getpid()))
if not me["early"]:
    wait_gate()

action, arg = me["action"], me.get("arg")
if action == "exit":
    os._exit(arg)
if action == "raise":
    raise RuntimeError(f"soak rank {rank} crashed on purpose")
if action == "signal":
    if arg not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(arg, signal.SIG_DFL)  # Python ignores SIGPIPE and handles SIGINT
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [arg])
    os.kill(os.getpid(), arg)
if action == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
if action == "flood":
    while time.monotonic() < SAFETY:
        chunk = bytearray()
        while len(chunk) < 16384:
            chunk += next(flood_source)
        put(0, bytes(chunk))
while time.monotonic() < SAFETY:  # hang, or a signal that did not end it
    time.sleep(1.0)
os._exit(0)
