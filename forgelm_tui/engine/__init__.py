"""The supervision engine: asyncio, the standard library and psutil only.

It knows nothing of any view: it turns a launch spec into rank processes, reports what happens as
typed events and takes commands (``request_cancel``, ``kill_now``, ``forward``).
"""
