"""asyncio without its TLS support, imported first by the CLI.

The supervisor never speaks TLS, and asyncio's own ``import ssl`` loads OpenSSL's libssl and
libcrypto: about 5 MiB, a sixth of a supervisor's RSS (bench/RESULTS.md). asyncio is written for
a Python without ssl (each of its modules binds ``ssl = None`` then), so it is imported here with
the ssl module hidden; ``import ssl`` works again afterwards for anything that needs it later
(textual-serve's web server, torch): only asyncio's own TLS paths see no ssl module.
"""

from __future__ import annotations

import sys

if "asyncio" not in sys.modules and "ssl" not in sys.modules:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
