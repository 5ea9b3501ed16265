"""A fake NVML for tests without a GPU: ``pynvml.py`` (put this directory first on a
subprocess's PYTHONPATH, or load it into sys.modules) and ``state.py`` (its state file)."""
