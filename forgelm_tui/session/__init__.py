"""One run: its attempts, their typed outcome and verdict, and how the run ends."""
