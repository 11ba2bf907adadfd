"""A Prometheus stand-in for the benchmarks: scrape ``/metrics`` on a schedule during a load,
then measure what one scrape costs the service's processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import psutil

from bench._procs import cpu_seconds


class Scraper:
    """Scrapes ``url/metrics`` every ``interval`` seconds until stopped (a thread)."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.latencies: list[float] = []
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.wait(self.interval):
                start = time.perf_counter()
                try:
                    ok = client.get(f"{self.url}/metrics").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - start)
                self.errors += not ok


def cpu_per_scrape(url: str, service: Callable[[], list[psutil.Process]], n: int = 50
                   ) -> float:
    """CPU seconds the service's processes spend per scrape: ``n`` scrapes back to back, the
    processes' CPU time before and after."""
    with httpx.Client(timeout=30) as client:
        client.get(f"{url}/metrics").raise_for_status()
        before = cpu_seconds(service())
        for _ in range(n):
            client.get(f"{url}/metrics").raise_for_status()
        return (cpu_seconds(service()) - before) / n
