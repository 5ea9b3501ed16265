"""The control store: torch's TCPStore, hosted by node 0's supervisor (not by a rank).

Every key lives under a per-run prefix. Calls block, so they run in the control plane's own
threads, each with its own client connection (a client serialises its calls: a blocking wait
on one connection would hold up every other call on it). Failures become two exceptions:
:class:`StoreLost` (the store cannot be reached: node 0 gone, the network cut) and
:class:`StoreTimeout` (a wait ran out).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

ROOT = "forgelm-tui"


class StoreLost(Exception):
    """The control store cannot be reached."""


class StoreTimeout(Exception):
    """A wait on the control store ran out."""


class PortTaken(Exception):
    """The control port is in use on this machine."""


def torch_distributed() -> Any:
    """torch.distributed, imported with its C++ logging silenced: its socket warnings would
    land in the middle of the TUI or of the headless lines. The ranks' environment is not
    touched (the variable is put back once the library has read it)."""
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed as dist
    finally:
        if before is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before
    return dist


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    dist = torch_distributed()
    try:
        yield
    except dist.DistNetworkError as exc:
        raise StoreLost(f"{what}: {_first_line(exc)}") from None
    except dist.DistStoreError as exc:
        text = str(exc)
        if "timeout" in text or "timed out" in text:
            raise StoreTimeout(f"{what}: {_first_line(exc)}") from None
        raise StoreLost(f"{what}: {_first_line(exc)}") from None
    except RuntimeError as exc:  # older builds raise plain RuntimeError for both
        if "timeout" in str(exc) or "timed out" in str(exc):
            raise StoreTimeout(f"{what}: {_first_line(exc)}") from None
        raise StoreLost(f"{what}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class ControlStore:
    """One connection to the control store, with JSON values under the run's prefix."""

    def __init__(self, raw: Any, prefix: str = ROOT, timeout: float = 0.0) -> None:
        self._raw = raw
        self.prefix = prefix
        self.timeout = timeout  # one call's, in seconds

    # ------------------------------------------------------------------ making one

    @classmethod
    def host(cls, port: int, timeout: float) -> ControlStore:
        """Node 0: listen on every address at ``port`` (the server lives in this process)."""
        dist = torch_distributed()
        try:
            raw = dist.TCPStore("0.0.0.0", port, None, True, timedelta(seconds=timeout),
                                wait_for_workers=False)
        except (dist.DistNetworkError, RuntimeError) as exc:
            if "EADDRINUSE" in str(exc) or "address already in use" in str(exc):
                raise PortTaken(f"control port {port} is already in use on this machine") \
                    from None
            raise StoreLost(f"cannot listen on control port {port}: {_first_line(exc)}") \
                from None
        return cls(raw, timeout=timeout)

    @classmethod
    def connect(cls, host: str, port: int, timeout: float) -> ControlStore:
        """Any node: a client connection; raises :class:`StoreLost` when nobody listens."""
        with _translated(f"cannot reach the control store at {host}:{port}"):
            raw = torch_distributed().TCPStore(host, port, None, False, timedelta(seconds=timeout),
                                   wait_for_workers=False)
        return cls(raw, timeout=timeout)

    def client(self, host: str, port: int, timeout: float) -> ControlStore:
        """Another connection to the same store, under the same prefix."""
        other = ControlStore.connect(host, port, timeout)
        other.prefix = self.prefix
        return other

    def scoped(self, run_id: str) -> None:
        self.prefix = f"{ROOT}/{run_id}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    # ------------------------------------------------------------------ calls

    def set(self, name: str, value: Any) -> None:
        with _translated(f"set {name}"):
            self._raw.set(self.key(name), json.dumps(value))

    def get(self, name: str) -> Any:
        """The value, waiting up to the connection's timeout for it to be set."""
        with _translated(f"get {name}"):
            return json.loads(self._raw.get(self.key(name)))

    def first(self, name: str, value: Any) -> Any:
        """Set ``name`` unless it is set already; the value that holds (first writer wins)."""
        text = json.dumps(value)
        with _translated(f"compare_set {name}"):
            held = self._raw.compare_set(self.key(name), "", text)
        return json.loads(held)

    def has(self, names: Sequence[str]) -> bool:
        with _translated("check"):
            return bool(self._raw.check([self.key(n) for n in names]))

    def many(self, names: Sequence[str]) -> list[Any]:
        """Values of keys known to exist."""
        with _translated("multi_get"):
            return [json.loads(v) for v in self._raw.multi_get([self.key(n) for n in names])]

    def add(self, name: str, amount: int) -> int:
        with _translated(f"add {name}"):
            return int(self._raw.add(self.key(name), amount))

    def push(self, queue: str, value: Any) -> None:
        with _translated(f"queue_push {queue}"):
            self._raw.queue_push(self.key(queue), json.dumps(value))

    def pop(self, queue: str, timeout: float) -> Any | None:
        """The next value of ``queue``, or None when none came within ``timeout``."""
        self.set_timeout(timeout)
        try:
            with _translated(f"queue_pop {queue}"):
                return json.loads(self._raw.queue_pop(self.key(queue), True))
        except StoreTimeout:
            return None

    def wait_get(self, name: str, timeout: float) -> Any | None:
        """The value of ``name`` once it is set, or None when it was not within ``timeout``
        (the store wakes every waiter of a key with one write)."""
        before = self.timeout
        self.set_timeout(timeout)
        try:
            return self.get(name)
        except StoreTimeout:
            return None
        finally:
            self.set_timeout(before)

    def wait_for(self, name: str, timeout: float) -> bool:
        """Whether ``name`` is set within ``timeout``, nothing read: the store answers every
        waiter of a key as it is written, one round trip (``get`` takes a second one)."""
        try:
            with _translated(f"wait {name}"):
                self._raw.wait([self.key(name)], timedelta(seconds=timeout))
        except StoreTimeout:
            return False
        return True

    def broadcast(self, value: Any) -> None:
        """A message every node's :class:`BroadcastReader` gets: two calls, whatever the
        number of nodes (a numbered key each node waits on; the store wakes them all)."""
        self.set(f"bcast/{self.add('bcast/n', 1)}", value)

    def set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        self._raw.set_timeout(timedelta(seconds=seconds))

    def close(self) -> None:
        self._raw = None


class Connections:
    """A node's connections to node 0's store: those made while joining (cluster/join.py's
    spares), then new ones (a call timed out, its late answer would be read as the next's)."""

    def __init__(self, store: ControlStore, spares: Sequence[ControlStore], host: str,
                 port: int, timeout: float) -> None:
        self.store, self.host, self.port, self.timeout = store, host, port, timeout
        self._spares = list(spares)

    def spare(self, call_wait: float) -> ControlStore:
        """A connection made while joining, else a new one."""
        if not self._spares:
            return self.connect(call_wait)
        spare = self._spares.pop()  # atomic: the inbox and the ticker take theirs at once
        spare.set_timeout(call_wait)
        return spare

    def connect(self, call_wait: float) -> ControlStore:
        """Another connection: up to the node timeout to make."""
        store = self.store.client(self.host, self.port, self.timeout)
        store.set_timeout(call_wait)
        return store


class BroadcastReader:
    """Reads the broadcasts in order, each once, on its own connection (it blocks)."""

    SKIP_AFTER = 3  # waits in a row on a number the counter has passed: its writer died

    def __init__(self, store: ControlStore) -> None:
        self.store = store
        self.next = 1
        self._passed = 0

    def read(self, timeout: float) -> Any | None:
        """The next broadcast, or None when none came within ``timeout``."""
        value = self.store.wait_get(f"bcast/{self.next}", timeout)
        if value is not None:
            self.next += 1
            self._passed = 0
            return value
        # A writer that died between taking its number and writing must not stop the reading.
        if self.store.add("bcast/n", 0) > self.next:
            self._passed += 1
            if self._passed >= self.SKIP_AFTER:
                self.next, self._passed = self.next + 1, 0
        return None
