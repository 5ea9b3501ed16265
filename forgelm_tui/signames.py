"""Signal names for every number a process can die of, as ``kill -l`` prints them. Never raises.

``signal.Signals(n)`` raises for the real-time signals (34..64 on Linux) and for glibc's
reserved 32 and 33: a rank killed by one of those must still be named, not crash the caller.
"""

from __future__ import annotations

import signal

_RTMIN = int(getattr(signal, "SIGRTMIN", 34))
_RTMAX = int(getattr(signal, "SIGRTMAX", 64))


def signal_name(number: int) -> str:
    """``SIGTERM``, ``SIGRTMIN+6`` (40), ``SIGRTMAX-2`` (62), ``SIG32``; any int, never raises."""
    if _RTMIN <= number <= _RTMAX:
        # kill -l: the first half counts up from SIGRTMIN, the second down from SIGRTMAX.
        if number == _RTMIN:
            return "SIGRTMIN"
        if number == _RTMAX:
            return "SIGRTMAX"
        if number - _RTMIN <= (_RTMAX - _RTMIN) // 2:
            return f"SIGRTMIN+{number - _RTMIN}"
        return f"SIGRTMAX-{_RTMAX - number}"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def signal_number(name: str) -> int | None:
    """The number for ``SIGUSR1``, ``usr1``, ``SIGRTMIN+3``, ``40``; None when it names none."""
    text = name.strip().upper()
    full = text if text.startswith("SIG") else f"SIG{text}"
    if full[3:].isdigit():  # "40", "SIG32": as kill -l names what it has no name for
        return int(full[3:])
    for base, value, sign in (("SIGRTMIN", _RTMIN, 1), ("SIGRTMAX", _RTMAX, -1)):
        if full == base:
            return value
        for op in ("+", "-"):
            prefix = base + op
            if full.startswith(prefix) and full[len(prefix):].isdigit():
                offset = int(full[len(prefix):]) * (1 if op == "+" else -1)
                number = value + offset
                return number if _RTMIN <= number <= _RTMAX and offset * sign >= 0 else None
    try:
        return int(signal.Signals[full])
    except KeyError:
        return None


def handles(caught_mask: int, ignored_mask: int, sig: int) -> bool:
    """A process with these /proc masks (SigCgt, SigIgn) catches or ignores ``sig``: its default
    action (for most signals: terminate) will not happen."""
    return sig > 0 and bool((caught_mask | ignored_mask) >> (sig - 1) & 1)
