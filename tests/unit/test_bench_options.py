"""The benchmark's options for the daemon's sampling interval (``bench.node --interval``)."""

import argparse

import pytest

from bench import fixture
from bench.run import positive_seconds


def test_node_config_samples_the_hardware_sources_at_the_interval_given():
    default, quick = fixture.node_config(), fixture.node_config(interval=1)
    for name in fixture.HARDWARE_SOURCES:
        assert default["sources"][name]["interval"] == 5.0
        assert quick["sources"][name]["interval"] == 1.0
    for name in ("checkpoint", "logs", "preflight"):  # their own defaults either way
        assert quick["sources"][name]["interval"] == default["sources"][name]["interval"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "five", ""])
def test_an_interval_that_is_no_positive_number_of_seconds_is_refused(value):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number of seconds above 0"):
        positive_seconds(value)


def test_a_positive_interval_is_read_in_seconds():
    assert positive_seconds("2.5") == 2.5
