"""Attach (SPEC §9): every run serves its events and takes commands on a Unix socket.

server.py (the run's side), client.py (a viewer's side), paths.py (where the socket and the
per-user registry of runs live). The protocol is in docs/control.md.
"""

# The wire form of every message, events included (engine/codec.py): a new protocol whenever an
# event loses or renames a field (2: RankSampled and RankSnapshot carry ``gauges``), so a viewer
# of another version says so in one line instead of failing on an event it cannot decode.
PROTOCOL = 2
