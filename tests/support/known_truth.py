"""The time ledger's known-truth run, for the ledger's unit tests and the end-to-end runs: start-up 20 s, steps of 1 s, a
10 s checkpoint save after step 100, a crash after step 130, gone 60 s, a restart with 5 s of start-up and a 15 s
checkpoint load, steps 101–130 redone, then on to step 200."""

from __future__ import annotations

from typing import Any

# Seconds of each kind in the script: what a ledger of it must show.
TRUTH = {
    "startup": 25.0,
    "productive": 200.0,
    "checkpoint_save": 10.0,
    "down": 60.0,
    "checkpoint_load": 15.0,
    "wasted": 30.0,
    "stalled": 0.0,
}
END = sum(TRUTH.values())
GOODPUT = TRUTH["productive"] / END


def step_time(step: int, run: int) -> float:
    """When step ``step`` ends, seconds into the script: run 1 from 20 s (a 10 s save after step 100), run 2 from 240 s."""
    if run == 1:
        return 20.0 + step + (10.0 if step > 100 else 0.0)
    return 240.0 + step - 100


def script() -> list[tuple[float, str, object]]:
    """(time, event, argument) of the whole run, on a clock starting at 0."""
    events: list[tuple[float, str, object]] = [(0.0, "start", "run-a")]
    for step in range(1, 131):
        events.append((step_time(step, 1), "step", step))
        if step == 100:
            events += [(step_time(100, 1), "save_started", None), (step_time(100, 1) + 10.0, "save_finished", None)]
    events += [(220.0, "start", "run-b"), (225.0, "load_started", None), (240.0, "load_finished", 100)]
    events += [(step_time(step, 2), "step", step) for step in range(101, 201)]
    return events


def play(ledger: Any, offset: float) -> None:
    """Feed ``script()`` to a ``Ledger`` alone (a tick after each event) and finish it at ``END``."""
    for at, event, arg in script():
        if event == "start":
            ledger.start_run(at, offset, "client", arg)
        elif event == "step":
            ledger.progress(at, offset, arg, "client")
        elif event.startswith("save"):
            ledger.save(event.split("_")[1], at, offset)
        else:
            ledger.load(event.split("_")[1], at, offset, resume=arg)
        ledger.tick(at, offset)
    ledger.finish(END, offset)
