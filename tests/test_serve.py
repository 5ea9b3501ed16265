"""`forgelm-tui serve` (SPEC §9): the attach viewer in a real headless Chromium, behind a token.

The browser is Debian's chromium (apt), driven by Playwright for Python; Playwright's own browser
download is not used. Chromium runs with WebGL off, so xterm.js draws with its DOM renderer and
the screen's text can be read from its rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import cli_env, pid_alive, rank_script, ready_pids, start, wait_for

SLEEPER = rank_script("sleeper.py")
CHROMIUM = Path("/usr/bin/chromium")
# The README's screenshot is rewritten only when asked (FORGELM_TUI_SCREENSHOTS=1): its pids and
# times differ on every run, and a test run must not leave the tree changed.
SCREENSHOT = Path(__file__).resolve().parent.parent / "screenshots" / "browser.png"


def _browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium (apt-get install chromium; .ci/run installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "no playwright (pip install -e '.[test]')"
    return None


MISSING = _browser_missing()
needs_browser = pytest.mark.skipif(MISSING is not None and not os.environ.get("CI"),
                                   reason=MISSING or "")


@dataclass
class Served:
    """A `--no-tui` run and `forgelm-tui serve` on it."""

    run: subprocess.Popen[str]
    run_dir: Path
    serve: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        found = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", "\n".join(self.lines))
        assert found, self.lines
        return found.group(0)

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    def viewers(self) -> list[psutil.Process]:
        """The attach processes textual-serve started, one per open tab."""
        found = []
        for child in psutil.Process(self.serve.pid).children(recursive=True):
            try:
                if "attach" in child.cmdline() and pid_alive(child.pid):
                    found.append(child)
            except psutil.Error:
                continue
        return found


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)


def start_serve(run_dir: Path, cwd: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`forgelm-tui serve RUN_DIR`, its output read in a thread; back once it printed its URL."""
    serve = subprocess.Popen(
        [sys.executable, "-m", "forgelm_tui", "serve", str(run_dir)], cwd=cwd, env=cli_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=_drain, args=(serve, lines), daemon=True).start()
    try:
        wait_for(lambda: "token=" in "".join(lines) or serve.poll() is not None, 30,
                 "serve to print its URL")
    except AssertionError:
        stop(serve, signal.SIGKILL)
        raise
    return serve, lines


@pytest.fixture
def served(tmp_path: Path, marks: Path) -> Iterator[Served]:
    run = start(["--nproc-per-node", "2", SLEEPER, str(marks)], tmp_path)
    ready_pids(marks, 2)
    wait_for((run.run_dir / "control.sock").exists, 30, "the control socket")
    serve, lines = start_serve(run.run_dir, tmp_path)
    it = Served(run.proc, run.run_dir, serve, lines)
    try:
        yield it
    finally:  # pass or fail, nothing started here outlives the test
        stop(serve, signal.SIGINT)  # the tabs' viewers too: they detach
        stop(run.proc, signal.SIGTERM)


def stop(proc: subprocess.Popen[str], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


# ---------------------------------------------------------------------------- in a browser

ROWS_JS = "() => Array.from(document.querySelectorAll('.xterm-rows > div'), r => r.textContent)" \
          ".join('\\n')"


class Tab:
    def __init__(self, page: Any) -> None:
        self.page = page

    def screen(self) -> str:
        return str(self.page.evaluate(ROWS_JS)).replace("\xa0", " ")

    def wait_screen(self, pattern: str, timeout: float = 45) -> str:
        regex = re.compile(pattern)
        try:
            return str(wait_for(lambda: regex.search(self.screen()) and self.screen(), timeout,
                                f"{pattern!r} in the browser", step=0.1))
        except AssertionError:
            raise AssertionError(f"{pattern!r} not on screen:\n{self.screen()}") from None

    def press(self, key: str) -> None:
        self.page.keyboard.press(key)


@pytest.fixture
def browser() -> Iterator[Any]:
    if MISSING is not None:
        pytest.fail(f"CI is set but the browser tests cannot run: {MISSING}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-3d-apis"])
        try:
            context = chromium.new_context(viewport={"width": 1120, "height": 600},
                                           accept_downloads=True)
            # Nothing beyond 127.0.0.1 (the page asks Google for a font: refused here).
            context.route(re.compile(r"^(?!(http|ws)://127\.0\.0\.1[:/]).*"),
                          lambda route: route.abort())
            yield context
        finally:
            chromium.close()


def open_tab(context: Any, url: str, first_screen: str = r"RUNNING") -> Tab:
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=30_000)
    page.wait_for_selector(".xterm", timeout=30_000)
    tab = Tab(page)
    tab.wait_screen(first_screen)
    page.click(".xterm")  # the keyboard goes to the terminal
    return tab


@needs_browser
@pytest.mark.timeout(150)
def test_browser_table_detach_cancel_and_download(served: Served, browser: Any,
                                                  tmp_path: Path) -> None:
    first = open_tab(browser, served.url)
    screen = first.wait_screen(r"rank 1 ready")
    assert re.search(r"^\s*0\s+0\s+\d+\s+\w+", screen, re.M), screen  # the rank table
    first.wait_screen(r"c Cancel")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    shot = SCREENSHOT if os.environ.get("FORGELM_TUI_SCREENSHOTS") else tmp_path / "browser.png"
    first.page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000

    # A signal to a tab's viewer ends that viewer; closing a tab detaches. The run goes on.
    (viewer,) = wait_for(served.viewers, 30, "the first tab's viewer")
    viewer.send_signal(signal.SIGTERM)
    wait_for(lambda: not served.viewers(), 30, "the viewer to end on SIGTERM")
    second = open_tab(browser, served.url)
    wait_for(served.viewers, 30, "the second tab's viewer")
    second.page.close()
    wait_for(lambda: not served.viewers(), 30, "the viewer to end with its tab")
    assert served.run.poll() is None

    third = open_tab(browser, served.url)
    third.press("c")
    third.wait_screen(r"Stop the run\?")
    third.press("y")
    assert served.run.wait(30) == 2
    envelope_path = served.run_dir / "envelope.json"
    cancel = json.loads(envelope_path.read_text())["cancel_requests"][0]
    assert cancel["source"] == "viewer" and "browser" in cancel["by"], cancel
    third.wait_screen(r"FINISHED.*exit 2")
    assert_downloads_the_envelope(third, envelope_path)
    late = open_tab(browser, served.url, r"FINISHED")  # a tab opened after the run's end
    late.wait_screen(r"exit 2 EXIT_TRAINING_ERROR")
    assert_downloads_the_envelope(late, envelope_path)

    served.serve.send_signal(signal.SIGINT)
    assert served.serve.wait(30) == 0


def assert_downloads_the_envelope(tab: Tab, envelope: Path) -> None:
    with tab.page.expect_download(timeout=30_000) as download:
        tab.press("s")
    assert Path(download.value.path()).read_bytes() == envelope.read_bytes()
    assert download.value.suggested_filename.startswith("forgelm-tui-envelope-")


# ---------------------------------------------------------------------------- no browser

@pytest.mark.timeout(90)
def test_every_route_needs_the_token(served: Served) -> None:
    url, base = served.url, served.base
    token = url.split("token=", 1)[1]
    for path in ("/", "/?token=wrong", "/ws", "/download/key", "/static/js/textual.js",
                 "/no-such-page"):
        assert status(base + path) == 403, path
    with urllib.request.urlopen(url, timeout=10) as page:
        assert page.status == 200
        cookie = page.headers["Set-Cookie"]
    assert f"forgelm_tui_token={token}" in cookie and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    with_cookie = {"Cookie": f"forgelm_tui_token={token}"}
    assert status(base + "/static/js/textual.js", with_cookie) == 200
    assert status(base + "/download/no-such-key", with_cookie) == 404  # past the token
    assert status(base + "/static/js/textual.js",
                  {"Cookie": "forgelm_tui_token=wrong"}) == 403
    assert status(base + "/ws", {**with_cookie, "Origin": "http://evil.example"}) == 403
    served.serve.send_signal(signal.SIGINT)
    assert served.serve.wait(30) == 0
    assert served.run.poll() is None  # serving, and stopping, never touch the run


@pytest.mark.timeout(90)
def test_serve_a_run_that_has_ended(tmp_path: Path) -> None:
    """Its tabs show the verdict and download the envelope (in a browser: the test above)."""
    from conftest import run_cli

    run = run_cli(["--nproc-per-node", "1", rank_script("exit_with.py"), "3"], tmp_path)
    assert run.proc.returncode == 3
    serve, lines = start_serve(run.run_dir, tmp_path)
    try:
        url = re.search(r"http://\S+", "".join(lines))
        assert url, lines
        assert status(url.group(0)) == 200
    finally:
        stop(serve, signal.SIGINT)
    assert serve.returncode == 0


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forgelm_tui", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(60)
def test_serve_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The first through the console script; the rest through main() in-process (they end
    before anything is served)."""
    from forgelm_tui.cli import main

    done = cli(["serve", "no-such-run-id"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "forgelm-tui serve: no-such-run-id: no such run (forgelm-tui ls lists the runs it "
        "knows)"]
    assert done.stdout == ""
    assert not (tmp_path / "forgelm-tui-runs").exists()  # no run dir, no envelope
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--host", "0.0.0.0", "no-such-run-id"]) == 1
    assert "not a loopback address; add --allow-remote" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 1
    assert "--port must be 0..65535, got 70000" in capsys.readouterr().err


# ---------------------------------------------------------------------------- units

@pytest.mark.timeout(30)
def test_the_viewer_command_is_quoted_from_an_argv_list(tmp_path: Path) -> None:
    from forgelm_tui.control.serve import browser_command

    run_dir = tmp_path / "a run; $(touch pwned) 'x\""
    assert shlex.split(browser_command(run_dir)) == [
        sys.executable, "-m", "forgelm_tui", "attach", "--via", "browser", str(run_dir)]
    assert shlex.split(browser_command(run_dir, read_only=True))[-2:] == [
        "--read-only", str(run_dir)]


@pytest.mark.timeout(30)
def test_loopback_hosts() -> None:
    from forgelm_tui.control.serve import is_loopback

    assert all(map(is_loopback, ("127.0.0.1", "127.0.0.2", "::1", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.0.0.1", "example.com")))


@pytest.mark.timeout(30)
async def test_token_middleware_without_a_browser() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from forgelm_tui.control.serve import TokenServer

    server = TokenServer("false", "s3cret", "http://127.0.0.1:1/?token=s3cret", "run test")
    app = await server._make_app()
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/")).status == 403
        assert (await client.get("/?token=nope")).status == 403
        assert (await client.get("/ws")).status == 403
        assert (await client.get("/download/k")).status == 403
        assert (await client.get("/static/css/xterm.css")).status == 403
        page = await client.get("/?token=s3cret")
        assert page.status == 200
        assert f"ws://{page.url.host}:{page.url.port}/ws" in await page.text()
        # The cookie it set opens the rest: assets, download keys, the websocket.
        assert (await client.get("/static/css/xterm.css")).status == 200
        assert (await client.get("/download/k")).status == 404
        assert (await client.get("/?token=nope")).status == 403  # the query decides first
        foreign = await client.get("/ws", headers={"Origin": "http://elsewhere.example"})
        assert foreign.status == 403
    client.session.cookie_jar.clear()
