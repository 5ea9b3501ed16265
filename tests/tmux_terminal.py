"""A real terminal for the CLI: a private tmux server, keys in, the screen out."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import wait_for


class Terminal:
    def __init__(self, tmp_path: Path) -> None:
        self.socket = f"ftui-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp_path
        self.exit_file = tmp_path / "exit-code"

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout

    def start(self, args: list[str], *, raw: bool = False,
              env: dict[str, str] | None = None) -> None:
        """``forgelm-tui --tui --run-dir TMP/run ARGS`` (``raw``: ``forgelm-tui ARGS``), with
        ``env`` added to the terminal's environment."""
        cli = [sys.executable, "-m", "forgelm_tui",
               *([] if raw else ["--tui", "--run-dir", str(self.tmp / "run")]), *args]
        # The pane's size is the terminal's: COLUMNS/LINES inherited from a test runner would
        # override it for the app (they say 80x24).
        script = f"unset COLUMNS LINES; cd {shlex.quote(str(self.tmp))}; {shlex.join(cli)}; " \
                 f"echo $? > {shlex.quote(str(self.exit_file))}; sleep 60"
        exported = [f"-e{k}={v}" for k, v in (("TERM", "xterm-256color"), ("CI", ""),
                                               ("HOME", str(self.tmp)),  # no ~/Downloads
                                               *(env or {}).items())]
        self.tmux("new-session", "-d", "-x", "150", "-y", "45", *exported, "sh", "-c", script)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J")

    def wait_screen(self, pattern: str, timeout: float = 45) -> str:
        regex = re.compile(pattern)

        def match() -> str | None:
            screen = self.screen()
            return screen if regex.search(screen) else None

        try:
            return str(wait_for(match, timeout, f"{pattern!r} on screen", step=0.1))
        except AssertionError:
            raise AssertionError(f"{pattern!r} not on screen:\n{self.screen()}") from None

    def press(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def exit_code(self) -> int:
        wait_for(lambda: self.exit_file.exists() and self.exit_file.read_text().strip(), 30,
                 "the CLI to exit")
        return int(self.exit_file.read_text())

    def envelope(self) -> dict[str, object]:
        return dict(json.loads((self.tmp / "run" / "envelope.json").read_text()))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=10)

    def reap(self) -> None:
        """After the test, pass or fail: nothing it started may outlive it. A supervisor that
        a failing test left behind (and its ranks, and its guardian) is found by its run dir."""
        import signal

        mark = str(self.tmp / "run").encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if mark in (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue
