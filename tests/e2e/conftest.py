"""Fixtures the end-to-end modules share."""

import pytest

from tests.support.realjobs_harness import model_facts


@pytest.fixture(scope="module")
def facts() -> dict:
    """The CPU's peak and the real jobs' model facts (``model_facts``), once per module that asks."""
    return model_facts()
