"""torchrun's ``--rdzv-conf KEY=VALUE,...``: every key torch 2.13's c10d rendezvous reads is
honoured (its meaning mapped onto forgelm-tui's join and control store) or refused by name,
never ignored (docs/multinode.md, "--rdzv-conf"). Pure.

The string is read as torch's ``_parse_rendezvous_config`` reads it: ``,``-separated pairs,
``key=value`` with both sides stripped, an empty key or value refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from forgelm_tui.plan.options import UsageError

TIMEOUTS = ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout")
WHY_NOT = {
    "heartbeat_timeout": "forgelm-tui's heartbeats are its own (a node is lost after "
                         "--node-timeout, or keep_alive_interval x keep_alive_max_attempt)",
    "timeout": "the etcd rendezvous' setting; forgelm-tui's join waits --join-timeout "
               "(or join_timeout)",
}


@dataclass(frozen=True)
class RdzvConf:
    """What ``--rdzv-conf`` set (None: not given; the defaults are the callers')."""

    join_timeout: float | None = None  # the join's deadline, as --join-timeout
    last_call_timeout: float | None = None  # elastic: the join window once MIN nodes joined
    close_timeout: float | None = None  # node 0's wait for the others to read the verdict
    read_timeout: float | None = None  # one control-store call once connected
    node_timeout: float | None = None  # keep_alive_interval x keep_alive_max_attempt
    is_host: bool | None = None  # whether this node hosts the store (node 0 does)
    keys: tuple[str, ...] = ()  # the keys given, for the envelope's settings


def parse_rdzv_conf(text: str | None) -> RdzvConf:
    pairs = _pairs(text or "")
    values: dict[str, object] = {}
    for key, value in pairs.items():
        if key in TIMEOUTS:
            values[key] = float(_positive_int(key, value))
        elif key == "is_host":
            values[key] = _bool(key, value)
        elif key == "store_type":
            if value.lower() != "tcp":
                raise UsageError(f"--rdzv-conf store_type={value}: forgelm-tui's control store "
                                 "is a TCPStore on node 0 (tcp); file stores are not supported")
        elif key not in ("keep_alive_interval", "keep_alive_max_attempt"):
            why = WHY_NOT.get(key, "not a key of torch's c10d rendezvous")
            raise UsageError(f"--rdzv-conf {key}: not supported ({why})")
    if "keep_alive_interval" in pairs or "keep_alive_max_attempt" in pairs:
        interval = _positive_int("keep_alive_interval", pairs.get("keep_alive_interval", "5"))
        attempts = _positive_int("keep_alive_max_attempt",
                                 pairs.get("keep_alive_max_attempt", "3"))
        values["node_timeout"] = float(interval * attempts)
    return RdzvConf(**values, keys=tuple(pairs))  # type: ignore[arg-type]


def _pairs(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    text = text.strip()
    if not text:
        return pairs
    for item in text.split(","):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not key or not value:
            raise UsageError(f"--rdzv-conf must be KEY=VALUE,...; got {item.strip()!r}")
        pairs[key] = value
    return pairs


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--rdzv-conf {key}={value}: a whole number of seconds") from None
    if number <= 0:
        raise UsageError(f"--rdzv-conf {key}={value}: must be more than 0")
    return number


def _bool(key: str, value: str) -> bool:
    """As torch's ``get_as_bool``: 1/true/t/yes/y and 0/false/f/no/n, any case."""
    lowered = value.lower()
    if lowered in ("1", "true", "t", "yes", "y"):
        return True
    if lowered in ("0", "false", "f", "no", "n"):
        return False
    raise UsageError(f"--rdzv-conf {key}={value}: use 1/true/yes or 0/false/no")
