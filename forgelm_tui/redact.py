"""Secrets out of what forgelm-tui shows and records: pure, stdlib only (docs/security.md).

An option or ``NAME=value`` whose name holds a secret word keeps its name and loses its value:
``--hf-token abc`` -> ``--hf-token <redacted>``, ``--api-key=abc`` -> ``--api-key=<redacted>``,
``HF_TOKEN=abc`` -> ``HF_TOKEN=<redacted>``. A name is split into words on ``-``, ``_``, ``.``
and camelCase; a secret word must be a whole word (``--key`` and ``--api-key`` are secret,
``--keyword`` and ``--monkey`` are not). The ranks still get the real argv; this is only for
the envelope, the views, the control socket and other nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "<redacted>"
SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "passphrase", "apikey", "key",
                          "credential", "credentials"})
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_ASSIGNED = re.compile(r"^[+~]*([A-Za-z_][A-Za-z0-9_.\-]*)=")  # NAME=value, a.b.c=value (hydra)


def words(name: str) -> list[str]:
    """``--hf-token`` -> ["hf", "token"]; ``apiKey`` -> ["api", "key"]; lower case."""
    return [w.lower() for part in re.split(r"[-_.\s]+", name) for w in _WORD.findall(part)]


def is_secret_name(name: str) -> bool:
    return any(w in SECRET_WORDS for w in words(name))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The argv with every secret value replaced by ``<redacted>``, names kept."""
    out: list[str] = []
    value_next = False
    for token in argv:
        if value_next:
            value_next = False
            if not token.startswith("-"):
                out.append(REDACTED)
                continue
        out.append(redact_token(token))
        if token.startswith("-") and "=" not in token and is_secret_name(token):
            value_next = True  # ``--hf-token abc``: the next token is the value
    return out


def shown_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The ranks' argv as events carry it to views, viewers and other nodes."""
    return tuple(redact_argv(argv))


def redact_token(token: str) -> str:
    """One token on its own: ``--name=value`` or ``NAME=value`` with a secret name."""
    if token.startswith("-") and "=" in token:
        name, _, _ = token.partition("=")
        return f"{name}={REDACTED}" if is_secret_name(name) else token
    match = _ASSIGNED.match(token)
    if match and is_secret_name(match.group(1)):
        return f"{token[: match.end()]}{REDACTED}"
    return token


def redact_text(text: str) -> str:
    """A one-line message that may quote the command line (an argparse error): each
    whitespace-separated word is read as argv."""
    parts = re.split(r"(\s+)", text)
    tokens = parts[::2]
    redacted = redact_argv([t.strip("'\",") for t in tokens])
    for index, (token, new) in enumerate(zip(tokens, redacted, strict=True)):
        if new != token.strip("'\","):
            parts[2 * index] = token.replace(token.strip("'\","), new, 1)
    return "".join(parts)
