"""One NVML session per process: owned here, borrowed by the GPU source, discovery and preflight.

NVML counts its ``nvmlInit`` and ``nvmlShutdown`` calls: "Shutdown only occurs when the reference count reaches zero"
(nvml.h, nvmlShutdown). While one user holds a reference, another user's shutdown-and-init re-initialises nothing, so
a GPU that was reset or re-bound to the driver is never enumerated anew. Here one object makes the process's only
``nvmlInit``/``nvmlShutdown`` calls and counts its borrowers itself. ``restart`` ends NVML and starts it again for all
of them at once (the GPU source does it to look for a lost GPU); a borrower that calls NVML outside the GPU source's
own thread does so holding ``lock``, so a restart never pulls handles from under it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator


class NvmlSession:
    """The process's NVML session over ``nvml`` (``pynvml`` or the fake of it)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self.lock = threading.RLock()
        self._borrowers = 0
        self._initialized = False
        self.generation = 0  # one more at every nvmlInit: a handle from an older generation is void

    @property
    def initialized(self) -> bool:
        return self._initialized

    def acquire(self) -> None:
        """Take a reference, initialising NVML if nobody holds one. Raises NVML's error when nvmlInit fails (no
        reference is taken then)."""
        with self.lock:
            if not self._initialized:
                self.nvml.nvmlInit()
                self._initialized = True
                self.generation += 1
            self._borrowers += 1

    def release(self) -> None:
        """Give a reference back; the last one shuts NVML down."""
        with self.lock:
            if self._borrowers == 0:
                return
            self._borrowers -= 1
            if self._borrowers == 0 and self._initialized:
                self._shutdown()

    def restart(self) -> None:
        """Shut NVML down and initialise it again for every borrower, so that it enumerates the GPUs anew. The
        caller must hold a reference. Raises NVML's error when nvmlInit fails; NVML is then down for every
        borrower until the next ``acquire`` or ``restart``."""
        with self.lock:
            if self._initialized:
                self._shutdown()
            self.nvml.nvmlInit()
            self._initialized = True
            self.generation += 1

    @contextmanager
    def borrowed(self) -> Iterator[Any]:
        """A reference and the lock for one block of NVML calls (preflight's read of the GPUs)."""
        with self.lock:
            self.acquire()
            try:
                yield self.nvml
            finally:
                self.release()

    def _shutdown(self) -> None:
        self._initialized = False
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass  # a driver in a bad state may refuse it; the session is over either way


def clock_event_reasons(nvml: Any, handle: Any, memo: dict[str, bool] | None = None) -> int:
    """The clock-event (throttle) reason bitmask: ``nvmlDeviceGetCurrentClocksEventReasons``, or on drivers before
    R535, which lack that symbol (pynvml raises FUNCTION_NOT_FOUND), and in nvidia-ml-py before 12.535, which lacks
    the name, the older ``nvmlDeviceGetCurrentClocksThrottleReasons``. A caller asking again and again passes a
    ``memo`` dict: once the newer call is found missing, only the older one is made."""
    newer = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if newer is not None and not (memo and memo.get("older")):
        try:
            return int(newer(handle))
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            if memo is not None:
                memo["older"] = True
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
