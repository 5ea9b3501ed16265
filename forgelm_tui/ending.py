"""How a run ended, as views and the CLI receive it: the verdict, the envelope, where it went.

A leaf module (it imports only the verdict), so views can name the type without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forgelm_tui.verdict import Verdict


@dataclass(frozen=True)
class RunEnding:
    verdict: Verdict
    envelope: dict[str, Any]
    envelope_path: str | None
    write_errors: tuple[str, ...] = ()
