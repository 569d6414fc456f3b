"""Training logs read with no change to the job: transport peeling, one parser per framework, derivation.

Pure: no files, no threads, no Prometheus. ``exporter.node.tail`` follows the files; ``exporter.sources.logs``
feeds the records to the job model and the checkpoint tracker.
"""

from exporter.logs.derive import INTEGRATED, Facts, JobLog, RunAction, SaveAction, Update, WaitAction
from exporter.logs.records import Checkpoint, DataWait, Line, Progress, Restore, Startup
from exporter.logs.stream import FORMATS, PARSERS, Event, LogStream

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
