"""The shared test helpers behave as the tests rely on: waiting returns the answer or fails naming what it waited
for, and exposition parsing keys samples by name and sorted labels."""

import itertools

import pytest

from tests.support.expo import labels, matching, samples
from tests.support.wait import wait_for, wait_until

TEXT = """# HELP mfu_gpu_up 1 when the GPU answers.
# TYPE mfu_gpu_up gauge
mfu_gpu_up{gpu="0"} 1.0
mfu_gpu_up{gpu="1"} 0.0
# HELP mfu_nic_pfc_pause_frames_total PFC pause frames.
# TYPE mfu_nic_pfc_pause_frames_total counter
mfu_nic_pfc_pause_frames_total{direction="rx",interface="ens1np0",priority="3"} 7.0
mfu_nic_pfc_pause_frames_total{direction="tx",interface="ens1np0",priority="3"} 2.0
"""


def test_wait_until_returns_the_first_truthy_answer():
    answers = itertools.chain([0, None, ""], itertools.repeat("ready"))
    assert wait_until(lambda: next(answers), timeout=5, interval=0.01) == "ready"


def test_wait_until_names_what_it_waited_for_and_the_last_answer():
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the port \(last: 0\)"):
        wait_until(lambda: 0, timeout=0.05, what="the port", interval=0.01)


def test_wait_until_ignores_only_the_exceptions_it_is_given():
    calls = itertools.count()

    def refused_twice():
        if next(calls) < 2:
            raise ConnectionRefusedError
        return True

    assert wait_until(refused_twice, timeout=5, interval=0.01, ignore=(OSError,))
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 / 0, timeout=5, ignore=(OSError,))


async def test_wait_for_has_the_same_contract_on_the_event_loop():
    answers = itertools.chain([False, False], itertools.repeat(3))
    assert await wait_for(lambda: next(answers), timeout=5, interval=0.01) == 3
    with pytest.raises(AssertionError, match="waiting for nothing"):
        await wait_for(lambda: False, timeout=0.05, what="nothing")


def test_samples_are_keyed_by_name_and_sorted_labels():
    found = samples(TEXT)
    assert found[("mfu_gpu_up", labels(gpu="1"))] == 0.0
    key = labels(priority="3", interface="ens1np0", direction="rx")
    assert key == (("direction", "rx"), ("interface", "ens1np0"), ("priority", "3"))
    assert found[("mfu_nic_pfc_pause_frames_total", key)] == 7.0
    assert sorted(matching(found, "mfu_nic_pfc_pause_frames_total", interface="ens1np0")) == [2.0, 7.0]
    assert matching(found, "mfu_gpu_up", gpu="2") == []
