"""Rank program: write binary_blob.BLOB to stdout, then a marker line; exit with argv[1]."""

import os
import sys

from binary_blob import BLOB

os.write(1, BLOB)
os.write(1, b"after the blob\n")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
