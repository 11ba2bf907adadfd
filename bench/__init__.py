"""Benchmarks: `python -m bench list` shows them, `python -m bench run NAME` runs one."""
