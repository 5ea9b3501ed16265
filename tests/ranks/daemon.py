"""Rank program that leaves a daemon behind, outside its process group, then exits.

argv: MARKS MODE CODE [--ignore-term] [--clean-env] [--stay]
MODE: ``session`` (Popen start_new_session=True), ``double`` (a double fork with setsid),
``setsid`` (``setsid -f``: setsid(1) forks, the daemon is orphaned at once).
Rank 1 starts the daemon, waits for it to write MARKS/daemon-1 (its pid), writes MARKS/env-1
(this run's TORCHELASTIC_RUN_ID and supervisor token) and exits CODE. The other ranks exit 0
at once when CODE is 0, else wait to be stopped. ``--ignore-term``: the daemon ignores SIGTERM;
``--clean-env``: it runs with an empty environment (only the subreaper finds it);
``--stay``: every rank waits to be stopped instead of exiting.
The daemon keeps the rank's stdout and stderr (as tensorboard or a tracker launched from a
training script does), so it also holds the rank's pipes open.

With ``--daemon MARKS RANK [--ignore-term]`` this file is the daemon itself.
"""

import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def daemon(marks: str, rank: str, ignore: bool) -> None:
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path = os.path.join(marks, f"daemon-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    while True:
        time.sleep(1)


def daemon_argv(marks: str, ignore: bool) -> list[str]:
    return [sys.executable, HERE, "--daemon", marks, os.environ["RANK"],
            *(["--ignore-term"] if ignore else [])]


def start(mode: str, argv: list[str], env: dict[str, str] | None) -> None:
    if mode == "session":
        subprocess.Popen(argv, start_new_session=True, env=env)
    elif mode == "setsid":
        subprocess.Popen(["setsid", "-f", *argv], env=env).wait()
    elif mode == "double":
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                if env is None:
                    os.execv(argv[0], argv)
                os.execve(argv[0], argv, env)
            os._exit(0)
        os.waitpid(child, 0)
    else:
        raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    if sys.argv[1] == "--daemon":
        daemon(sys.argv[2], sys.argv[3], "--ignore-term" in sys.argv)
        return
    marks, mode, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])
    if rank != 1:
        if code != 0 or "--stay" in sys.argv:
            time.sleep(3600)
        return
    env = {} if "--clean-env" in sys.argv else None
    start(mode, daemon_argv(marks, "--ignore-term" in sys.argv), env)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(marks, "daemon-1")) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(os.path.join(marks, "env-1"), "w") as handle:
        handle.write(f"{os.environ['TORCHELASTIC_RUN_ID']}\n"
                     f"{os.environ.get('FORGELM_TUI_SUPERVISOR', '')}\n")
    print(f"rank {rank}: daemon started ({mode}), exiting {code}", flush=True)
    if "--stay" in sys.argv:
        time.sleep(3600)
    sys.exit(code)


main()
