"""Prints what a program sees of how it was started, then exits with argv[1] (default 0)."""

import json
import os
import sys

print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                  "main_file": getattr(sys.modules["__main__"], "__file__", None),
                  "cwd": os.getcwd()}), flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
