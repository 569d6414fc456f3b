"""The job model's refusals share one base, so the HTTP layer maps them with one ``except`` (tests/unit/web/test_app.py
and tests/unit/web/test_checkpoint_api.py pin the answers' bodies)."""

import pytest

from mfu_exporter.model import errors
from mfu_exporter.model.checkpoints import CheckpointConflict
from mfu_exporter.model.errors import TooManyJobs, ValidationError


@pytest.mark.parametrize(
    "error,status,field",
    [
        (ValidationError("model.params", "model.params: not a count"), 400, "model.params"),
        (CheckpointConflict("checkpoint", "already counted"), 409, "checkpoint"),
        (TooManyJobs("this exporter already tracks 2 running jobs (ingest.max_jobs)"), 429, "job"),
    ],
)
def test_each_refusal_is_an_ingest_error_with_its_status_and_field(error, status, field):
    assert isinstance(error, errors.IngestError)
    assert (error.status, error.field, str(error)) == (status, field, error.message)


def test_the_model_modules_raise_the_errors_modules_classes():
    # One class per refusal: the names the model modules export are the very classes, not copies.
    assert (ValidationError, CheckpointConflict, TooManyJobs) == (
        errors.ValidationError,
        errors.CheckpointConflict,
        errors.TooManyJobs,
    )
