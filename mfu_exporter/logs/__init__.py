"""Training logs read with no change to the job: transport peeling, one parser per framework, derivation.

Pure: no files, no threads, no Prometheus. ``mfu_exporter.node.tail`` follows the files; ``mfu_exporter.sources.logs``
feeds the records to the job model and the checkpoint tracker.
"""

from mfu_exporter.logs.derive import INTEGRATED, Facts, JobLog, RunAction, SaveAction, Update, WaitAction
from mfu_exporter.logs.records import Checkpoint, DataWait, Line, Progress, Restore, Startup
from mfu_exporter.logs.stream import FORMATS, PARSERS, Event, LogStream

__all__ = [
    "FORMATS",
    "INTEGRATED",
    "PARSERS",
    "Checkpoint",
    "DataWait",
    "Event",
    "Facts",
    "JobLog",
    "Line",
    "LogStream",
    "Progress",
    "Restore",
    "RunAction",
    "SaveAction",
    "Startup",
    "Update",
    "WaitAction",
]
