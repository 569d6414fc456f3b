"""Time to page, measured: every demo incident with an alert pages through a real Prometheus and a real Alertmanager,
on time, naming its job and node and its runbook entry, and resolves after the incident; no alert fires that no
incident explains (docs/runbook.md, "Time to page").

One demo runs the whole rotation, each incident lasting as long as its page needs (``--for NAME=DURATION,...``, 30 s
of healthy training between them). Debian's Prometheus evaluates the shipped rules of alerts/ and Debian's
Alertmanager routes with alerts/alertmanager.example.yaml, its receivers (pager, chat) posting to a webhook receiver,
an HTTP server in this test; info goes nowhere, as shipped.

At speed: the demo runs at ``--speed SPEED``, and Prometheus and Alertmanager run the shipped files on a clock SPEED
times faster (tests/support/timescale.py): every duration of the rules and of the routing divided by SPEED (range
windows, offsets, subquery steps, ``for:``, group intervals; the shipped 15 s scrape and evaluation intervals, the
lookback delta and the resend delay), ``rate()``, ``irate()`` and ``deriv()`` divided by SPEED (the demo's counters
grow SPEED times faster per wall second) and ``time()`` read on the demo's clock. A rule then sees the same samples at
the same demo times as at full speed: a 5-minute window holds 20 scrapes, as a real one does, so ``rate()`` has its
two samples and more; nothing else of the files changes. Times are measured on the wall clock and read on the
demo's (its speed and origin, from ``GET /api/v1/demo``), so a time to page in demo seconds is wall seconds × SPEED.
Prometheus's scrape timeout is its interval, 187 ms at speed 80: it scrapes the demo through a relay that answers
with the demo's newest exposition within half of that (tests/support/paging_harness.py, ``Relay``), since a demo
starved of CPU on a loaded machine can be slower, and a failed scrape would mark every series stale and start each
alert's ``for:`` again, where a real node has seconds to answer.

What is checked, for each incident's expected alert (``PAGES``):

- it arrives at the webhook while the incident lasts, at most its ``for:`` + two evaluation intervals + the route's
  ``group_wait`` after Prometheus first saw its condition hold (the alert's ``activeAt``), and that condition held
  at most its ``onset`` after the incident began (the rule's window: a 5-minute rate of zero needs five minutes).
  Both bounds are in demo time with ``LAG`` demo seconds more, the delays of a loaded machine (wall × SPEED);
- it carries its runbook link (``runbook_url`` ending ``#<alert>``), names the node (its ``instance`` or its
  description) and a job the incident touches;
- it resolves after the incident ends (Prometheus's ``endsAt``, with ``LAG`` as above) and Alertmanager says so;
- every alert that fires, expected or not, began within an incident (from its start to its end plus the rules'
  5-minute windows), and names no job the incident leaves alone and no other node.

Each wait ends on the thing itself (the webhook's post); the deadline is the demo's clock passing the time the page
was due by, never a wall-clock timeout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.paging_harness import Notification, PagingStack, paging_stack
from tests.support.prom_harness import RULE_FILES, SCRAPE_JOB
from tests.support.timescale import seconds

pytestmark = pytest.mark.slow

SPEED = 80.0
GAP = 30.0  # demo seconds of healthy training before each incident (--incident-gap's least)
# Before the first: Prometheus begins scraping a new target within 5 wall seconds, then loads the rules (time() reads
# the demo's clock, known once it runs): 8 wall seconds.
WARM_UP = 8 * SPEED
# The shipped evaluation interval (deploy/fleet/prometheus-shard.yaml), demo seconds; a group may set its own.
EVALUATION = 15.0
GROUP_WAIT = 30.0  # alerts/alertmanager.example.yaml's group_wait: a new group's first notification waits it
GROUP_INTERVAL = 300.0  # its group_interval: a resolved alert is told at the group's next flush
WINDOW = 300.0  # the rules' longest range window: a cleared fault holds a rate up to it
# Demo seconds a loaded machine may add to a measured delay: scheduling of the demo's ticks, Prometheus's
# evaluations, Alertmanager's flushes and the webhook, each a fraction of a wall second (1.5 wall s at speed 60).
LAG = 90.0


@dataclass(frozen=True)
class Page:
    alert: str
    severity: str
    onset: float  # demo seconds from the incident's start until the alert's condition holds, at most: why, below


# What each incident pages, and the most its signal takes to meet the alert's condition. A gauge or a new event
# shows within a scrape and an evaluation or two (30 s); a share over a 5-minute rate crosses 10% within ~70 s of a
# 45% pause (90 s); NCCL Inspector names a straggler after ~8 of its 2 s dumps, and the job's 1-minute MFU shows an
# input wait within a minute (60 s); a 5-minute rate falls to zero 5 minutes after the last token (300 s); a write
# is over 5 minutes old 5 minutes after it starts (300 s).
PAGES: dict[str, tuple[Page, ...]] = {
    "pfc-storm": (Page("MfuPfcPauseStorm", "critical", 30.0), Page("MfuPfcPauseStorm", "warning", 90.0)),
    "checkpoint-stall": (Page("MfuCheckpointStalled", "warning", 300.0),),
    "thermal": (Page("MfuGpuThermalThrottle", "warning", 30.0),),
    "gpu-lost": (Page("MfuGpuLost", "critical", 30.0),),
    "crash-restart": (Page("MfuTrainingStalled", "critical", 300.0),),
    "straggler": (Page("MfuJobStraggler", "warning", 60.0),),
    "nccl-socket-fallback": (Page("MfuNcclSocketFallback", "warning", 30.0),),
    "input-stall": (Page("MfuInputBound", "warning", 60.0),),
    "uncorrectable-ecc": (Page("MfuGpuResetRequired", "critical", 30.0),),
}
NODE_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):\d+\b")
RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
# The alerts about a job (the global tier's file): each names its job in a label.
JOB_ALERTS = {rule["alert"] for group in yaml.safe_load(RULE_FILES[1].read_text())["groups"] for rule in group["rules"]}


def shipped(alert: str, severity: str) -> tuple[float, float]:
    """The ``for:`` of the shipped rule ``alert`` at ``severity`` (0 without one) and its group's evaluation
    interval, in seconds."""
    found = {
        (seconds(rule.get("for", "0s")), seconds(group.get("interval", f"{EVALUATION:g}s")))
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == alert and rule["labels"]["severity"] == severity
    }
    assert len(found) == 1, f"{alert} ({severity}): {found}"
    return found.pop()


def due(page: Page) -> float:
    """Demo seconds after its incident's start by which ``page`` arrives at the latest."""
    wait, evaluation = shipped(page.alert, page.severity)
    return page.onset + wait + 2 * evaluation + GROUP_WAIT + LAG


def lengths() -> dict[str, float]:
    """How long each incident lasts in the run: until its last page is due, in whole minutes."""
    return {name: 60.0 * math.ceil(max(due(page) for page in pages) / 60.0) for name, pages in PAGES.items()}


def jobs_named(notification: Notification, jobs: set[str]) -> set[str]:
    named = {notification.labels["training_job"]} if "training_job" in notification.labels else set()
    description = notification.annotations.get("description", "")
    return named | {job for job in jobs if re.search(rf"\b{re.escape(job)}\b", description)}


def nodes_named(notification: Notification) -> set[str]:
    named = {notification.labels["instance"]} if "instance" in notification.labels else set()
    return named | set(NODE_ADDRESS.findall(notification.annotations.get("description", "")))


@dataclass
class Row:
    name: str
    start: float
    end: float
    touches: set[str]


def first_firing(notifications: list[Notification]) -> dict[tuple, Notification]:
    """Each alert's first firing notification, by its labels."""
    first: dict[tuple, Notification] = {}
    for notification in sorted(notifications, key=lambda n: n.arrived):
        if notification.status == "firing":
            first.setdefault(notification.key, notification)
    return first


def onset_of(stack: PagingStack, notification: Notification) -> float:
    """When Prometheus first saw the alert's condition hold in the episode that fired, in demo time (its activeAt;
    else the notification's startsAt, for an alert fired and gone between two polls)."""
    return stack.clock.demo(stack.pending.get(notification.key, notification.starts_at) or notification.starts_at)


def pages_for(stack: PagingStack, notification: Notification, row: Row) -> bool:
    """Whether ``notification`` is a page for the incident ``row``: its condition began within the incident, or
    began before it and the page arrived within it. The second is a stop that one incident began and the next
    continues: the rotation's stops (gpu-lost, uncorrectable-ecc, crash-restart) come 30 s apart, and where no
    scrape in between sees the job's tokens move (two scrapes at most, fewer on a loaded machine), the 5-minute
    rate of tokens stays at zero and one alert covers both incidents."""
    onset = onset_of(stack, notification)
    if row.start - EVALUATION <= onset <= row.end:
        return True
    return onset < row.start <= stack.clock.demo(notification.arrived) <= row.end


def resolved(stack: PagingStack, notification: Notification) -> Notification | None:
    return next(
        (
            n
            for n in stack.webhook.all()
            if n.key == notification.key and n.status == "resolved" and n.arrived > notification.arrived
        ),
        None,
    )


def scrapes_failed(stack: PagingStack, notification: Notification) -> bool:
    """Whether Prometheus recorded failed scrapes of the demo from the alert's onset on: on a loaded machine the demo
    can be slower to answer than a scrape timeout divided by the speed (187 ms at speed 80), which no real node's
    10 s timeout would notice; MfuExporterDown then says so truly, about the test's clock rather than the demo."""
    active = stack.pending.get(notification.key, notification.starts_at) or notification.starts_at
    failed = stack.prometheus.api(
        "query_range", query=f'up{{job="{SCRAPE_JOB}"}} == 0', start=active - 1, end=active + 30, step="100ms"
    )["result"]
    return bool(failed)


def check_belongs(stack: PagingStack, notification: Notification, incidents: list[Row], jobs: set[str]) -> None:
    """The alert began within an incident (its start to its end and the rules' windows after), names no job the
    incident leaves alone and no node but the demo's. MfuExporterDown is the machine's, not the demo's, where
    Prometheus failed to scrape the demo (``scrapes_failed``)."""
    if notification.name == "MfuExporterDown" and scrapes_failed(stack, notification):
        print(f"\nMfuExporterDown: Prometheus failed to scrape the demo (a loaded machine): {notification.labels}")
        return
    active = onset_of(stack, notification)
    row = next((r for r in incidents if r.start - EVALUATION <= active <= r.end + WINDOW), None)
    assert row is not None, f"{notification.name} {notification.labels} began at {active:.0f}, in no incident"
    assert jobs_named(notification, jobs) <= row.touches, (row.name, notification)
    assert nodes_named(notification) <= {stack.node}, (row.name, notification)


def test_every_incident_pages_on_time_with_its_runbook_job_and_node_and_nothing_else_pages(tmp_path):
    run = lengths()
    spec = ",".join(f"{name}={seconds:.0f}s" for name, seconds in run.items())
    args = ["--incident-gap", f"{GAP:.0f}s", "--warm-up", f"{WARM_UP:.0f}s", "--for", spec]
    with paging_stack(tmp_path, SPEED, args) as stack:
        truth = stack.truth()
        names = truth["schedule"]["incidents"]
        assert set(names) == set(PAGES), "an incident without a page in PAGES, or a page for no incident"
        assert truth["schedule"]["incident_seconds"] == run
        begun = stack.now()
        jobs = set(truth["jobs"])
        assert not truth["incidents"], "an incident began before Prometheus had the rules and the demo's series"

        def rows() -> list[Row]:
            return [
                Row(row["name"], row["start"], row["end"], set(row["touches"]))
                for row in stack.truth()["incidents"][: len(names)]
                if row["end"] is not None
            ]

        def outstanding() -> list[str]:
            """What is still to come: incidents not yet over, pages not yet sent, alerts not yet resolved."""
            ended = rows()
            missing = [f"{name} not over" for name in names[len(ended) :]]
            first = first_firing(stack.webhook.all())
            for row in ended:
                for page in PAGES[row.name]:
                    fired = [
                        n
                        for n in first.values()
                        if (n.name, n.labels.get("severity")) == (page.alert, page.severity)
                        and pages_for(stack, n, row)
                    ]
                    missing += [f"{row.name}: {page.alert} ({page.severity}) not paged"] if not fired else []
                    missing += [
                        f"{row.name}: {n.name} {n.labels} not resolved" for n in fired if not resolved(stack, n)
                    ]
            return missing

        # The whole rotation, then the last incident's alerts resolving: its windows and a group interval.
        until = begun + WARM_UP + truth["schedule"]["rotation_seconds"] + WINDOW + GROUP_INTERVAL + 2 * LAG
        left: list[str] = []

        def done() -> bool:
            left[:] = outstanding()
            return not left

        try:
            stack.wait_demo(done, until, "every incident's page and its resolution", interval=1.0)
        except AssertionError as exc:
            failed, scrapes = stack.scrapes()
            late = stack.relay.late
            fired = sorted((round(onset_of(stack, n)), n.name, n.status) for n in stack.webhook.all())
            began = [(row.name, round(row.start), round(row.end)) for row in rows()]
            raise AssertionError(
                f"{exc}: {left} ({failed} of {scrapes} scrapes failed, {late} late); incidents {began}; "
                f"notifications (onset, alert, status) {fired}"
            ) from None
        failed, scrapes = stack.scrapes()
        print(f"\n{failed} of {scrapes} scrapes failed; {stack.relay.late} answered from the demo's previous one")
        notifications = stack.webhook.all()
        incidents = rows()

    first = first_firing(notifications)
    print("\ntime to page (demo seconds from the incident's start): incident, alert, severity, page, onset, delay")
    for notification in first.values():
        check_belongs(stack, notification, incidents, jobs)
    for row in incidents:
        for page in PAGES[row.name]:
            fired = sorted(
                (
                    n
                    for n in first.values()
                    if (n.name, n.labels.get("severity")) == (page.alert, page.severity) and pages_for(stack, n, row)
                ),
                key=lambda n: n.arrived,
            )
            assert fired, f"{row.name}: {page.alert} ({page.severity}) never paged"
            page_at = stack.clock.demo(fired[0].arrived)
            active = onset_of(stack, fired[0])
            hold, evaluation = shipped(page.alert, page.severity)
            to_page, onset, delay = page_at - row.start, active - row.start, page_at - active
            print(f"  {row.name:22} {page.alert:24} {page.severity:8} {to_page:7.0f} {onset:6.0f} {delay:6.0f}")
            assert page_at <= row.end, f"{row.name}: {page.alert} paged after the incident ended"
            assert active - row.start <= page.onset + 2 * evaluation + LAG, (row.name, page, active - row.start)
            assert page_at - active <= hold + 2 * evaluation + GROUP_WAIT + LAG, (row.name, page, page_at - active)
            # An alert about a node or its hardware names the jobs its node blames the fault for now (a query in its
            # description), so a notification rendered between two blames may name none: one of them does.
            every = [n for n in notifications if n.key in {f.key for f in fired} and n.status == "firing"]
            assert any(jobs_named(n, jobs) & row.touches for n in every), (row.name, page, every)
            for notification in fired:
                receiver = "pager" if page.severity == "critical" else "chat"
                assert notification.receiver == receiver, (row.name, notification)
                url = notification.annotations["runbook_url"]
                assert url.endswith(f"runbook.md#{page.alert.lower()}"), url
                assert f"## {page.alert}\n" in RUNBOOK.read_text()
                assert nodes_named(notification) == {stack.node}, (row.name, notification)
                if page.alert in JOB_ALERTS:
                    assert jobs_named(notification, jobs) & row.touches, (row.name, notification)
                done = resolved(stack, notification)
                assert done is not None and done.ends_at is not None, (row.name, notification)
                # Resolved once the incident ends, give or take the same LAG: a wall second without CPU is LAG demo
                # seconds the demo's job and exporter did not see, at the incident's end as at its start.
                resolved_at = stack.clock.demo(done.ends_at)
                assert resolved_at >= row.end - 2 * EVALUATION - LAG, (row.name, notification, row.end - resolved_at)


def test_the_demos_own_rotation_pages_for_each_incident_that_outlasts_its_for_and_for_nothing_else(tmp_path):
    """The rotation as ``make demo`` runs it (2-minute incidents, the checkpoint stall's 15-minute write), at speed:
    an incident that lasts past its alert's condition and ``for:`` pages (the storm's error events, the stalled
    write's five minutes), one that does not stays quiet, and every alert that fires began within an incident and
    names only what it touches."""
    args = ["--incident-gap", f"{GAP:.0f}s", "--warm-up", f"{WARM_UP:.0f}s"]
    with paging_stack(tmp_path, SPEED, args) as stack:
        assert not stack.truth()["incidents"], "an incident began before Prometheus had the rules and the series"
        check_the_default_rotation(stack, stack.now())


def check_the_default_rotation(stack: PagingStack, begun: float) -> None:
    truth = stack.truth()
    names, jobs = truth["schedule"]["incidents"], set(truth["jobs"])
    end_of_rotation = begun + WARM_UP + truth["schedule"]["rotation_seconds"]
    stack.wait_demo(lambda: stack.now() > end_of_rotation + WINDOW, end_of_rotation + WINDOW + LAG, "the rotation")
    incidents = [
        Row(row["name"], row["start"], row["end"] or math.inf, set(row["touches"]))
        for row in stack.truth()["incidents"]
    ]
    first = first_firing(stack.webhook.all())
    for notification in first.values():
        if onset_of(stack, notification) <= end_of_rotation + WINDOW:
            check_belongs(stack, notification, incidents, jobs)
    paged = []
    for row in incidents[: len(names)]:
        length = row.end - row.start
        for page in PAGES[row.name]:
            wait, evaluation = shipped(page.alert, page.severity)
            if page.onset + wait + 2 * evaluation > length:
                continue  # the incident ends before its alert can fire: no page owed
            assert any(
                (n.name, n.labels.get("severity")) == (page.alert, page.severity) and pages_for(stack, n, row)
                for n in first.values()
            ), f"{row.name} lasted {length:.0f} s, past {page.alert}'s condition and for:, and did not page"
            paged.append((row.name, page.alert, page.severity))
    fired = sorted({(n.name, n.labels.get("severity")) for n in first.values()})
    print("\nthe demo's own rotation: owed and paged", paged, "; every alert that fired", fired)
    assert {name for name, _, _ in paged} >= {"pfc-storm", "checkpoint-stall"}
