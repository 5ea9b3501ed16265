import json
import sys

print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0],
                  "spec": __spec__.name if __spec__ else None}), flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
