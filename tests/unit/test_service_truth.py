"""The service's figures for a job that behaves as real ones do: loads, restarts and clocks, tick by tick."""

from exporter.config import validate
from exporter.service import build_service


class Clocks:
    """The node's two clocks: monotonic seconds, and a wall clock that drifts from it by a little every read."""

    def __init__(self, wall: float = 1_800_000_000.0):
        self.mono = 1000.0
        self.base = wall - self.mono
        self.reads = 0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        self.reads += 1
        return self.base + self.mono + self.reads * 1e-6

    def advance(self, seconds: float) -> None:
        self.mono += seconds


def service_with(clocks: Clocks, jobs: dict | None = None):
    config = validate({"jobs": jobs or {"llama": {"params": 7e9, "gpus": 8, "peak_tflops": 989}}})
    return build_service(config, [], clock=clocks.time, monotonic=clocks.monotonic)


def test_one_checkpoint_load_is_counted_once_over_many_ticks():
    clocks = Clocks()
    service = service_with(clocks)
    service.ingest_progress({"job": "llama", "event": "start", "run": "r1"})
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_started", "step": 100})
    clocks.advance(30.0)
    service.ingest_progress({"job": "llama", "event": "checkpoint_load_finished", "step": 100})
    tokens = 0.0
    for second in range(200):
        clocks.advance(1.0)
        if second % 5 == 0:
            tokens += 5 * 4000.0
            service.ingest_progress({"job": "llama", "tokens_total": tokens, "step": 101 + second // 5})
        service.evaluate_once()
    totals = service.restores.totals()["llama"]
    assert totals.loads == 1
    assert abs(totals.seconds - 30.0) < 0.01
