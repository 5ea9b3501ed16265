"""Attach (SPEC §9): every run serves its events and takes commands on a Unix socket.

server.py (the run's side), client.py (a viewer's side), paths.py (where the socket and the
per-user registry of runs live). The protocol is in docs/control.md.
"""
