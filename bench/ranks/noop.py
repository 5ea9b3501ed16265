"""Rank program: does nothing (launch + teardown floor)."""
