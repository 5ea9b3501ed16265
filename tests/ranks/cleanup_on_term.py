"""Waits; on a stop it runs its ``except Exception`` / ``finally`` cleanup, as ForgeLM does.

argv: MARKS_DIR
"""

import os
import sys
import time

marks = sys.argv[1]
rank = os.environ.get("RANK", "0")
try:  # ready inside the try: a stop right after the mark is still caught
    open(os.path.join(marks, f"ready-{rank}"), "w").close()
    while True:
        time.sleep(0.05)
except Exception as exc:  # ForgeLM: audit pipeline.failed, print the JSON result, exit 2
    with open(os.path.join(marks, f"caught-{rank}"), "w") as handle:
        handle.write(type(exc).__name__ + ": " + str(exc))
    sys.exit(2)
finally:
    open(os.path.join(marks, f"finally-{rank}"), "w").close()
