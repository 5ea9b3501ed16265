"""Which GPUs CUDA_VISIBLE_DEVICES lets a process see, read as torch reads it (pure).

torch (``torch.cuda._parse_visible_devices`` and ``_device_count_nvml``) reads the variable as
CUDA does: comma-separated ordinals read like ``strtoul`` (``1gpu2`` is 1), a negative or
unreadable one ends the list, a repeated one makes it empty; or UUIDs (``GPU-...``, a unique
prefix is enough) with the same rules; ``MIG-...`` instances are counted as listed. Unset: every
device. ``--nproc-per-node gpu`` counts what this returns, without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def _strtoul(text: str) -> int:
    """The number ``text`` starts with (an optional sign, then digits); -1 for none."""
    end = 0
    for index, char in enumerate(text):
        if char.isdigit() or (index == 0 and char in "+-"):
            end = index + 1
        else:
            break
    try:
        return int(text[:end]) if end else -1
    except ValueError:  # a sign alone
        return -1


def _with_prefix(value: str, prefix: str) -> list[str]:
    out: list[str] = []
    for item in value.split(","):
        if item in out:
            return []  # a repeated id: no device at all, as CUDA does
        if not item.startswith(prefix):
            break
        out.append(item)
    return out


def _uuid_ordinals(candidates: Sequence[str], uuids: Sequence[str]) -> list[int]:
    out: list[int] = []
    for candidate in candidates:
        matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(candidate)]
        if len(matches) != 1:
            break  # unknown or ambiguous: the list ends here
        if matches[0] in out:
            return []
        out.append(matches[0])
    return out


def visible_indices(value: str | None, uuids: Sequence[str]) -> list[int] | int:
    """The NVML indices of the devices ``value`` (CUDA_VISIBLE_DEVICES) shows, in CUDA's order,
    given every device's UUID in NVML order; for MIG instances only their count."""
    if value is None:
        return list(range(len(uuids)))
    if value.startswith("MIG-"):
        return len(_with_prefix(value, "MIG-"))
    if value.startswith("GPU-"):
        return _uuid_ordinals(_with_prefix(value, "GPU-"), uuids)
    out: list[int] = []
    for item in value.split(","):
        ordinal = _strtoul(item.strip())
        if ordinal in out:
            return []
        if ordinal < 0:
            break
        out.append(ordinal)
    for position, ordinal in enumerate(out):
        if ordinal >= len(uuids):
            return out[:position]  # trimmed at the first device that does not exist
    return out


def visible_count(value: str | None, uuids: Sequence[str]) -> int:
    shown = visible_indices(value, uuids)
    return shown if isinstance(shown, int) else len(shown)
