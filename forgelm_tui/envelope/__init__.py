"""The envelope (SPEC §6): a run's typed outcome serialised, written atomically."""
