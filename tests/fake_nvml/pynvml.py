"""A fake ``pynvml`` (nvidia-ml-py's API, the parts forgelm-tui uses) for tests without a GPU.

Put this directory first on PYTHONPATH (a supervisor subprocess) or in ``sys.modules`` as
``pynvml`` (in-process). It reads a JSON state file named by FAKE_NVML_STATE, again whenever the
file changes, so a test drives it by rewriting the file (tests/fake_nvml/state.py)::

    {"init_error": null,                         # or "LibraryNotFound", "DriverNotLoaded"
     "devices": [{"uuid": "GPU-0a..", "name": "Fake GPU", "utilization": 40,
                  "memory_used": 1073741824, "memory_total": 85899345920,
                  "temperature": 61,               # null: NotSupported
                  "power_mw": 250000,              # null: NotSupported
                  "error": null}],                 # "GpuIsLost", "Unknown", "Timeout":
                                                   #   every call on the device raises it
     "processes": [{"pid": 123, "device": 0, "used": 1073741824, "kind": "compute"}]}

``CALLS`` counts calls by function name (tests check what was asked, and how often).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028  # as nvidia-ml-py: the v2 struct's version
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

CALLS: Counter[str] = Counter()
STATE_ENV = "FAKE_NVML_STATE"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _error_class(name: str, code: int) -> type[NVMLError]:
    def init(self: NVMLError) -> None:
        NVMLError.__init__(self, code)

    return type(f"NVMLError_{name}", (NVMLError,), {"__init__": init})


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_DriverNotLoaded = _error_class("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _error_class("Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)
_BY_NAME = {c.__name__.removeprefix("NVMLError_"): c for c in (
    NVMLError_Uninitialized, NVMLError_NotSupported, NVMLError_DriverNotLoaded,
    NVMLError_Timeout, NVMLError_LibraryNotFound, NVMLError_GpuIsLost, NVMLError_Unknown)}

_cache: dict[str, Any] = {"key": None, "state": {}}
_initialised = False


def _state() -> dict[str, Any]:
    path = os.environ.get(STATE_ENV)
    if not path:
        return {"devices": [], "processes": []}
    try:
        stat = os.stat(path)
    except OSError:
        return {"devices": [], "processes": []}
    key = (path, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if _cache["key"] != key:
        try:
            with open(path, encoding="utf-8") as handle:
                _cache["state"] = json.load(handle)
            _cache["key"] = key
        except (OSError, ValueError):  # caught mid-rewrite: the last state stands
            pass
    return _cache["state"]


def _raise(name: str | None) -> None:
    if name:
        raise _BY_NAME[name]()


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _device(handle: _Handle) -> dict[str, Any]:
    if not _initialised:
        raise NVMLError_Uninitialized()
    devices = _state().get("devices", [])
    if handle.index >= len(devices):
        raise NVMLError_GpuIsLost()
    device = devices[handle.index]
    _raise(device.get("error"))
    return device


def nvmlInit() -> None:
    global _initialised
    CALLS["nvmlInit"] += 1
    _raise(_state().get("init_error"))
    _initialised = True


def nvmlShutdown() -> None:
    global _initialised
    _initialised = False


def nvmlDeviceGetCount() -> int:
    CALLS["nvmlDeviceGetCount"] += 1
    if not _initialised:
        raise NVMLError_Uninitialized()
    return len(_state().get("devices", []))


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    CALLS["nvmlDeviceGetHandleByIndex"] += 1
    handle = _Handle(index)
    _device(handle)
    return handle


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_device(handle)["uuid"])


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_device(handle).get("name", "Fake GPU"))


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> SimpleNamespace:
    CALLS["nvmlDeviceGetUtilizationRates"] += 1
    device = _device(handle)
    return SimpleNamespace(gpu=device.get("utilization", 0), memory=0)


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> SimpleNamespace:
    """v2 ``used`` leaves out the driver's reservation (``memory_reserved``), as nvidia-smi
    does; v1 counts it. ``"memory_v2": false`` in a device: an old driver without v2."""
    CALLS["nvmlDeviceGetMemoryInfo"] += 1
    device = _device(handle)
    used, total = device.get("memory_used", 0), device.get("memory_total", 0)
    if version is None:
        used += device.get("memory_reserved", 0)
    elif not device.get("memory_v2", True):
        raise NVMLError(25)  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    return SimpleNamespace(used=used, total=total, free=total - used)


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    CALLS["nvmlDeviceGetTemperature"] += 1
    value = _device(handle).get("temperature")
    if value is None:
        raise NVMLError_NotSupported()
    return int(value)


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    CALLS["nvmlDeviceGetPowerUsage"] += 1
    value = _device(handle).get("power_mw")
    if value is None:
        raise NVMLError_NotSupported()
    return int(value)


def _processes(handle: _Handle, kind: str) -> list[SimpleNamespace]:
    _device(handle)
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used"))
            for p in _state().get("processes", [])
            if p.get("device") == handle.index and p.get("kind", "compute") == kind]


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[SimpleNamespace]:
    CALLS["nvmlDeviceGetComputeRunningProcesses"] += 1
    return _processes(handle, "compute")


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[SimpleNamespace]:
    return _processes(handle, "graphics")
