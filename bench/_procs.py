"""CPU time of processes the benchmarks watch (a service and its children, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants; empty when it has exited."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """CPU seconds (user + system) the processes have used so far; one that exited meanwhile
    counts nothing."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
