"""`forgelm-tui serve` (SPEC §9): the attach viewer of one run, in a web browser.

textual-serve starts one process of its command for every browser connection, through a shell,
and has no authentication. So the command is fixed before the server starts: `forgelm-tui
attach <run dir> --via browser`, built with `shlex.join` from an argv list; a tab is one more
viewer of that run, and closing it only detaches (textual-serve asks the viewer to quit; a
viewer never cancels a run by leaving). And every request, the page, its websocket, its assets
and the download route, needs the random token: in the query string (`?token=`), else in the
cookie the page sets; anything else gets 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, web
from aiohttp.typedefs import Handler, Middleware
from textual_serve.app_service import AppService
from textual_serve.server import Server

from forgelm_tui.control.client import ControlClient, ControlError
from forgelm_tui.control.find import KnownRun, NotFound, find_run

TOKEN_COOKIE = "forgelm_tui_token"
SHUTDOWN_WAIT = 5.0  # seconds for open tabs' viewers to leave after Ctrl+C
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def browser_command(run_dir: Path, read_only: bool = False) -> str:
    """The viewer textual-serve starts per tab: this interpreter, this package, this run."""
    return shlex.join([sys.executable, "-m", "forgelm_tui", "attach", "--via", "browser",
                       *(["--read-only"] if read_only else []), str(run_dir.absolute())])


def _token_ok(given: str | None, expected: bytes) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)


def token_middleware(token: str) -> Middleware:
    """403 for any request without the token: `?token=` decides when present, else the cookie.
    The page's response sets the cookie, so its websocket, assets and downloads carry it.
    A request from another origin (a page elsewhere opening our websocket) is refused too."""
    expected = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.query.get("token", request.cookies.get(TOKEN_COOKIE))
        if not _token_ok(given, expected):
            raise web.HTTPForbidden(text="forgelm-tui serve: the URL's token is required\n")
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="forgelm-tui serve: a request from another origin\n")
        response = await handler(request)
        if not response.prepared:  # a websocket or a download has sent its headers already
            if "token" in request.query:
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict",
                                    path="/")
            response.headers["Referrer-Policy"] = "no-referrer"  # the token stays here
            response.headers["Cache-Control"] = "no-store"
        return response

    return require_token


class TokenServer(Server):
    """textual-serve's Server behind the token, on a socket bound beforehand, quiet (no access
    log: its lines would carry the token), and quick to stop with tabs open."""

    def __init__(self, command: str, token: str, url: str, title: str) -> None:
        super().__init__(command, title=title)
        self.token = token
        self.url = url
        self.websockets: set[web.WebSocketResponse] = set()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(token_middleware(self.token))
        return app

    async def handle_index(self, request: web.Request) -> Any:
        # The websocket's URL as the browser reached the page (an ssh tunnel, localhost), so
        # the cookie set for that host goes with it.
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def _process_messages(self, websocket: web.WebSocketResponse,
                                app_service: AppService) -> None:
        self.websockets.add(websocket)
        try:
            await super()._process_messages(websocket, app_service)
        finally:
            self.websockets.discard(websocket)

    async def on_startup(self, app: web.Application) -> None:
        print(f"forgelm-tui serve: {self.title} at {self.url} (Ctrl+C stops serving; the run "
              "goes on)", flush=True)

    async def on_shutdown(self, app: web.Application) -> None:
        """Close the tabs' websockets: each viewer is asked to quit (a detach)."""
        for websocket in list(self.websockets):
            with contextlib.suppress(Exception):
                await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"server stopped")

    def serve_on(self, sock: socket.socket) -> None:
        """Serve until SIGINT or SIGTERM."""
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_exit)
        web.run_app(self._make_app(), sock=sock, handle_signals=False, loop=loop, print=None,
                    access_log=None, shutdown_timeout=SHUTDOWN_WAIT)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def page_url(host: str, sock: socket.socket, token: str) -> str:
    port = sock.getsockname()[1]
    shown = socket.gethostname() if host in WILDCARD_HOSTS else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/?token={token}"


def serve_target(target: str | None) -> KnownRun:
    """The run to serve, checked now: a live supervisor that answers on its socket, or a run
    that has ended and left its envelope (a tab then shows the verdict and downloads it)."""
    run = find_run(target)
    if not run.live:
        if run.envelope() is None:
            raise NotFound(f"{run.run_id}: the run is gone and left no envelope")
        return run
    assert run.socket is not None
    ControlClient(run.socket, timeout=5.0).close()
    return run


def execute_serve(target: str | None, host: str, port: int, allow_remote: bool,
                  say: Callable[[str], None], read_only: bool = False) -> int:
    """Serve the run's viewer until Ctrl+C (0); a bad run, host or port: one line, 1."""
    if not allow_remote and not is_loopback(host):
        say(f"forgelm-tui serve: --host {host} is not a loopback address; add --allow-remote "
            "to serve the run's controls there")
        return 1
    try:
        run = serve_target(target)
    except (NotFound, ControlError, OSError) as exc:
        say(f"forgelm-tui serve: {exc}")
        return 1
    try:
        sock = listen(host, port)
    except OSError as exc:
        say(f"forgelm-tui serve: cannot listen on {host}:{port} ({exc.strerror or exc})")
        return 1
    if not is_loopback(host):
        say(f"forgelm-tui serve: warning: listening on {host}, not loopback: anyone who can "
            "reach it with the URL can cancel the run, and plain http shows the token to the "
            "network")
    token = secrets.token_urlsafe(32)
    server = TokenServer(browser_command(run.run_dir, read_only), token,
                         page_url(host, sock, token), f"run {run.run_id}")
    server.serve_on(sock)
    return 0
