"""How a run ended, as views and the CLI receive it: the verdict, the envelope, where it went.

A leaf module (it imports only the verdict), so views can name the type without the engine.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelm_tui.verdict import Verdict


@dataclass(frozen=True)
class RunEnding:
    verdict: Verdict
    envelope: dict[str, Any]
    envelope_path: str | None  # the first place it was written to; None if none
    write_errors: tuple[str, ...] = ()
    envelope_paths: tuple[str, ...] = ()  # every file it was written to (and only those)

    def envelope_text(self) -> str:
        """The envelope as written; from memory when no file could be (a full disk)."""
        if self.envelope_path:
            with contextlib.suppress(OSError):
                return Path(self.envelope_path).read_text(encoding="utf-8")
        return json.dumps(self.envelope, indent=2, ensure_ascii=False) + "\n"

    def where_line(self, on_stdout: bool = False) -> str:
        """``; envelope: a, b`` for a closing line: files that exist, and nothing else."""
        places = list(self.envelope_paths)
        if on_stdout:
            places.append("stdout")
        return f"; envelope: {', '.join(places)}" if places else "; envelope: not written"
