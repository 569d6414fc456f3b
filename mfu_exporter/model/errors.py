"""Why the job model refused an ingest (a progress report, a checkpoint event): one base for every refusal.

Each refusal carries the HTTP status it answers with and the field at fault, so the server maps them all with one
``except IngestError`` to ``{"error": message, "field": field}``. The model knows the status code as a number only;
nothing here imports HTTP. Log lines that feed the same model (``mfu_exporter.sources.logs``) catch the subclasses.
"""

from __future__ import annotations


class IngestError(Exception):
    """A request the job model refuses: ``status`` is the HTTP answer (4xx), ``field`` the key at fault (dotted for
    nested keys, "" for the body as a whole), ``message`` what to change."""

    status = 400

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class ValidationError(IngestError):
    """A bad request body."""

    status = 400


class CheckpointConflict(IngestError):
    """An event for a checkpoint write that already ended here."""

    status = 409


class NotFound(IngestError):
    """A request for a job, or a part of one, this node does not have."""

    status = 404


class TooManyJobs(IngestError):
    """One more running job than ``ingest.max_jobs``; the job named by the request is the one refused."""

    status = 429

    def __init__(self, message: str, field: str = "job"):
        super().__init__(field, message)
