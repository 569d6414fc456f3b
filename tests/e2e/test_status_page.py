"""The status page in a real browser: Debian's headless Chromium runs the page's own JavaScript against the demo."""

import html
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.browser import HEADLESS, browser
from tests.support.demo_harness import get_json, metric_samples, running_demo
from tests.support.tools import require_tool
from tests.support.wait import wait_until

CHROMIUM_FLAGS = [
    *HEADLESS,
    # Virtual time runs the page's timers and fetches until the budget is spent: at least two refreshes.
    "--virtual-time-budget=5000",
]


def chromium(tmp_path, url, *args, width=1400):
    browser = require_tool("chromium", "chromium")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    flags = [*CHROMIUM_FLAGS, f"--window-size={width},1500", f"--user-data-dir={profile}"]
    result = subprocess.run([browser, *flags, *args, url], capture_output=True, timeout=90)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    return result.stdout.decode()


def browse(tmp_path, base, poll, width=1400):
    """The page's DOM after the browser ran it, with ``poll()`` called every 50 ms meanwhile (and once after), so
    what the API said all the while the page read it is known, however far the simulated job moved meanwhile."""
    browsing = threading.Event()

    def polling():
        while not browsing.wait(0.05):
            poll()

    poller = threading.Thread(target=polling, daemon=True)
    poller.start()
    try:
        return chromium(tmp_path, base, "--dump-dom", width=width)
    finally:
        browsing.set()
        poller.join()
        poll()


def test_page_shows_the_apis_mfu_and_a_forced_incident(tmp_path):
    # A long window keeps MFU steady between the browser's read and ours.
    with running_demo("--incident", "thermal", "--mfu.window", "60s", speed=20) as base:
        # The node's count of GPUs held down by heat (the per-GPU reasons are at series: full); the page names GPU 1.
        throttled = ("mfu_node_gpus_throttled", (("cause", "thermal"),))
        wait_until(lambda: metric_samples(base).get(throttled) == 1, 30, "a GPU throttled for heat")
        readings = []

        def settled():
            readings.append(get_json(base + "api/v1/jobs")["jobs"][0]["mfu"] or 0)
            return len(readings) >= 3 and 0.27 < readings[-1] < 0.33 and max(readings[-3:]) - min(readings[-3:]) < 0.003

        wait_until(settled, 40, "MFU to settle near 30%", interval=0.5)
        # The page reads the API while the browser runs; what the API said all that time is polled beside it, so
        # the comparison holds however far a loaded machine lets the simulated job move meanwhile.
        during = [readings[-1]]
        dom = browse(tmp_path, base, lambda: during.append(get_json(base + "api/v1/jobs")["jobs"][0]["mfu"] or 0))

        assert int(re.search(r'data-updates="(\d+)"', dom).group(1)) >= 1, "the page never updated itself"
        shown_ratio, shown_text = re.search(r'data-mfu="([0-9.]+)">([0-9.]+)%<', dom).groups()
        assert shown_text == f"{100 * float(shown_ratio):.1f}"  # the figure printed is the one the page received
        assert min(during) - 0.005 < float(shown_ratio) < max(during) + 0.005  # and it is one the API gave
        gpu1 = re.search(r"<tr><td[^>]*>1</td>.*?</tr>", dom).group(0)
        assert "hw_thermal_slowdown" in gpu1.replace("<wbr>", "") and "91 °C" in gpu1
        assert "ens3np0" in dom and "mlx5_2/1" in dom
        cause = re.search(r'<div class="cause" data-cause="([a-z_]+)">(.*?)</div>', dom)
        assert cause, "the page does not say why MFU is low"
        assert cause.group(1) == "thermal" and "GPU 1 throttled: hw_thermal_slowdown" in cause.group(2)
        assert 'data-job="bert-pretrain"' in dom and "kubernetes" in dom  # the discovered job, and how it was found

        screenshot = tmp_path / "status-page.png"
        chromium(tmp_path, base, f"--screenshot={screenshot}")
        assert screenshot.stat().st_size > 20_000


def test_page_shows_a_gpus_health_and_the_action_it_asks_for(tmp_path):
    """The demo's uncorrectable ECC error on GPU 0: the GPU table's health column shows the state the API gives, with
    the last Xid, and the note under the table names the action."""
    with running_demo("--incident", "uncorrectable-ecc", speed=20) as base:

        def gpu0():
            (source,) = [s for s in get_json(base + "api/v1/status")["sources"] if s["source"] == "gpu"]
            gpus = source["status"].get("gpus", [])  # none before the source's first sample
            return next((g["health"] for g in gpus if g["index"] == 0), {})

        wait_until(lambda: gpu0().get("state") == "reset_required", 30, "GPU 0 to need a reset")
        dom = browse(tmp_path, base, lambda: None)
        row = re.search(r"<tr><td[^>]*>0</td>.*?</tr>", dom).group(0)
        assert re.search(r'<span class="chip down" title="[^"]*nvidia-smi -r[^"]*">reset_required</span>', row)
        assert "Xid 154" in row
        note = f"GPU 0: reset_required (Xid 95 ROBUST_CHANNEL_UNCONTAINED_ERROR): {gpu0()['action']}"
        assert note in html.unescape(dom)
        assert ">healthy</span>" in re.search(r"<tr><td[^>]*>1</td>.*?</tr>", dom).group(0)


def test_the_run_timeline_draws_a_band_per_run_coloured_by_kind(tmp_path):
    """The demo's job crashes and restarts: the page draws its two runs from the time ledger, with the down and
    checkpoint-load bands, and the goodput it shows is the API's."""
    with running_demo("--incident", "crash-restart", speed=20) as base:
        url = base + "api/v1/jobs/llama3-70b/ledger"
        wait_until(
            lambda: len(get_json(url)["runs"]) == 2 and get_json(url)["kinds"]["checkpoint_load"] > 0,
            60,
            "the restart and its checkpoint load",
            ignore=(OSError,),
        )
        dom = chromium(tmp_path, base, "--dump-dom")
        card = re.search(r'<div class="card" data-job="llama3-70b">.*?</svg>\s*</div>\s*</div>', dom, re.DOTALL)
        assert card, "the job's card has no run timeline"
        timeline = re.search(r'<div class="timeline" data-goodput="([0-9.]+)" data-runs="(\d+)">', card.group(0))
        assert timeline and int(timeline.group(2)) == 2
        assert 0 < float(timeline.group(1)) < 1
        bands = set(re.findall(r'<rect class="band [a-z_]+" data-run="(\d+)" data-kind="([a-z_]+)"', card.group(0)))
        assert ("1", "startup") in bands and ("1", "down") in bands and ("2", "checkpoint_load") in bands


def test_page_lists_the_training_logs_the_exporter_reads(tmp_path):
    """--progress logs: the demo's job prints torchtitan's lines; the page's "Training logs" table shows the file,
    the format detected and that it is read (a detected format that reads nothing would show why instead)."""
    with running_demo("--progress", "logs", speed=20) as base:
        wait_until(
            lambda: any((j.get("step") or 0) >= 2 for j in get_json(base + "api/v1/jobs")["jobs"]), 30, "2 steps"
        )
        dom = chromium(tmp_path, base, "--dump-dom")
    section = re.search(r"<h2>Training logs</h2>(.*?)</section>", dom, re.S)
    assert section, "the page has no Training logs section"
    row = re.search(r"<tbody>(.*?)</tbody>", section.group(1), re.S)
    assert row, section.group(1)[:500]
    assert "torchtitan" in row.group(1) and "reading" in row.group(1) and "no progress" not in row.group(1)


# --- every field the page shows for a job, against /api/v1/jobs ----------------------------------------------------

CARD = re.compile(r'<div class="card" data-job="([^"]*)">(.*?)</dl>', re.S)
FACT = re.compile(r'<dd data-field="([^"]+)" data-value="([^"]*)">(.*?)</dd>', re.S)
SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def at(job, path):
    for key in path.split("."):
        job = (job or {}).get(key)
    return job


def agrees(value, candidates):
    """``value`` is one the API gave: a number within the range the API's answers spanned while the browser read
    (the demo's job moves meanwhile), a mapping key by key, anything else equal to one answer."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        numbers = [c for c in candidates if isinstance(c, (int, float)) and not isinstance(c, bool)]
        slack = 1e-9 * max(abs(n) for n in numbers) if numbers else 0
        return bool(numbers) and min(numbers) - slack <= value <= max(numbers) + slack
    if isinstance(value, dict):
        mappings = [c for c in candidates if isinstance(c, dict)]
        return bool(mappings) and all(agrees(v, [m.get(k) for m in mappings]) for k, v in value.items())
    return value in candidates


def read_number(text):
    """The number in a fact the page printed: "3,664", "491.34 k", "3.96 PFLOP/s", "64.9%"."""
    m = re.fullmatch(r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)(%| ?([kMGTP]?)[A-Za-z/]*)", text.strip())
    assert m, f"not a number the page's formatters print: {text!r}"
    number = float(m.group(1).replace(",", ""))
    return number / 100 if m.group(2) == "%" else number * SI[m.group(3) or ""]


def read_duration(text):
    """Seconds in a duration the page printed: "185.1 d", "3 h 5 m", "12 m 3 s", "45 s"."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"([0-9][0-9,]*(?:\.[0-9]+)?) ([dhms])\b", text)
    assert parts and " ".join(f"{n} {u}" for n, u in parts) == text.strip(), f"not a duration: {text!r}"
    return sum(float(n.replace(",", "")) * units[u] for n, u in parts)


def printed_right(field, value, text):
    """The text is ``value`` as the page's formatters print it (within the digits they keep), never NaN."""
    if field == "cadence_seconds" and value is None:
        return text == "learning (two counts needed)"
    if value is None or (field == "gpus" and value == []):
        return text in ("–", "—")
    if field in ("gpus", "discovered.gpus"):
        return text == str(len(value) if isinstance(value, list) else value)
    if field in ("data_wait.source", "bottleneck.baseline_from"):
        return text == value
    if field == "cadence_seconds":
        every, after = re.fullmatch(r"a count every (.+), stalled after (.+)", text).groups()
        return abs(read_duration(every) - value) <= 1 and abs(read_duration(after) - 3 * value) <= max(3, 0.05 * value)
    if field in ("found_by", "gpu_indices"):
        return text == (", ".join(str(v) for v in value) or "—")
    if field == "eta_seconds":
        shown = read_duration(text)
        return abs(shown - value) <= (0.05 * 86400 if text.endswith(" d") else 60)
    if field == "checkpoint":
        if value.get("in_progress"):
            return text.startswith(f"writing {value['in_progress']} for ")
        if value.get("last_duration_seconds") is not None:
            return text.startswith("last took ") and abs(read_duration(text[10:]) - value["last_duration_seconds"]) < 60
        return text == "none yet"
    shown = read_number(text)
    if field.startswith("hardware."):
        return abs(shown - value) <= 0.0005 + 1e-12
    if field in ("tokens_per_second", "step"):
        return abs(shown - value) <= 0.5
    return abs(shown - value) <= 0.005 * abs(value) + 1e-9  # si(): two decimals of the scaled value


@pytest.mark.parametrize("width", [1400, 800])
def test_every_field_the_page_shows_for_a_job_is_the_apis(tmp_path, width):
    """The demo's llama3-70b says its GPUs as a list ([0, 1, 2, 3]); bert-pretrain is found by discovery alone: its
    card shows the GPUs discovery found (4), its hardware estimate as the headline, labelled so, and "–" for what it
    never reported. Every other fact, the MFU, the reason and the cause are the API's; the MFU's colour follows the
    job's own attribution (the 25% line, a cause below its baseline), and "updated" is the wall clock, not the demo's
    simulated one that runs minutes ahead. At 1,400 and 800 px the page never scrolls sideways."""
    with running_demo(speed=20) as base:
        # Until the demo's clock is a minute ahead of the wall clock, so the two "updated" could show differ, and
        # the discovered job has a hardware estimate to show.
        wait_until(
            lambda: (
                (jobs := {j["job"]: j for j in get_json(base + "api/v1/jobs")["jobs"]}).get("llama3-70b", {}).get("mfu")
                and ((jobs.get("bert-pretrain") or {}).get("hardware") or {}).get("headline") is not None
                and get_json(base + "api/v1/status")["time"] - time.time() > 60
            ),
            30,
            "llama3-70b to have an MFU, bert-pretrain a hardware estimate, and the demo's clock to run a minute ahead",
        )
        answers: list[dict] = []

        def poll():
            answers.append({j["job"]: j for j in get_json(base + "api/v1/jobs")["jobs"]})

        started = time.time()
        poll()
        dom = browse(tmp_path, base, poll, width)
        ended = time.time()
        simulated = get_json(base + "api/v1/status")["time"]

    assert "NaN" not in dom and "undefined" not in dom
    updated = float(re.search(r'id="updated"[^>]*data-time="([0-9.]+)"', dom).group(1))
    # Virtual time may run the page's clock a few seconds ahead of ours (its budget is 5 s), never minutes.
    assert started - 1 <= updated <= ended + 6, (started, updated, ended)
    assert simulated - ended > 60, "the demo's clock no longer runs ahead: this check would not tell the two apart"

    cards = {html.unescape(name): body for name, body in CARD.findall(dom)}
    assert set(cards) == set(answers[-1]) == {"llama3-70b", "bert-pretrain"}, sorted(cards)
    for name, body in cards.items():
        seen = [a[name] for a in answers if name in a]
        assert re.search(rf"<h3>{re.escape(html.escape(name))}</h3>", body)
        colour, kind, raw_mfu, mfu_text = re.search(
            r'<div class="mfu (\w+)" data-headline="(\w+)" data-mfu="([^"]*)">([^<]*)<', body
        ).groups()
        mfu = float(raw_mfu) if raw_mfu else None
        assert agrees(mfu, [j["mfu"] for j in seen]), (name, mfu)
        if mfu is not None:
            assert kind == "mfu" and mfu_text == f"{100 * mfu:.1f}%"
            headline = mfu
        else:  # the hardware estimate, labelled so
            assert kind == "hardware" and 'data-label-for="hardware">Hardware estimate, not MFU<' in body, body[:600]
            headline = float(mfu_text.strip().rstrip("%")) / 100
            assert any(abs(headline - j["hardware"]["headline"]) <= 0.0005 for j in seen), (name, headline)
        causes = [(j.get("bottleneck") or {}).get("cause") for j in seen]
        expected = {"bad"} if headline < 0.25 else {"warn" if c not in (None, "none") else "good" for c in causes}
        assert colour in expected, (name, colour, headline, causes)
        reason = re.search(r"<div class=\"muted\" data-reason=\"\">(.*?)</div>", body)
        assert agrees(html.unescape(reason.group(1)) if reason else None, [j["reason"] for j in seen]), name
        cause = re.search(r'<div class="cause" data-cause="([a-z_]+)">', body)
        causes = [(j.get("bottleneck") or {}).get("cause") for j in seen]
        assert (cause.group(1) in causes) if cause else any(c in (None, "none") for c in causes), (name, causes)

        facts = FACT.findall(body)
        assert len(facts) == body.count("<dt>") >= 10, f"{name}: a fact printed without the field it shows"
        for field, raw, text in facts:
            value, text = json.loads(html.unescape(raw)), html.unescape(text)
            assert agrees(value, [at(j, field) for j in seen]), (name, field, value)
            assert printed_right(field, value, text), (name, field, value, text)
        shown = {field: html.unescape(text) for field, _, text in facts}
        if name == "llama3-70b":
            assert seen[-1]["gpus"] == [0, 1, 2, 3] and shown["gpus"] == "4"  # a list: how many
        else:  # found by discovery alone: the GPUs it found, and "–" (never 0) for what it never reported
            assert seen[-1]["gpus"] is None and shown["discovered.gpus"] == "4"
            assert seen[-1]["tokens_total"] is None and seen[-1]["last_report_time"] is None
            assert shown["tokens_total"] == "–"
    assert 'data-overflow-x="0"' in dom, re.search(r'data-overflow-x="(-?\d+)"', dom)


# --- the page as drawn: geometry, labels and formats at 1,400 and 800 px ----------------------------------------

MEASURE = (Path(__file__).parent / "status_page_measure.js").read_text()
# The page's chart() drawn into the page from given points (arguments: points, kind, baseline): its scale's top, its
# percent ticks' labels and centres, and the line's box.
CHART = """
const probe = document.createElement("div");
probe.className = "card";
probe.innerHTML = chart(arguments[0], arguments[1], arguments[2], arguments[0][arguments[0].length - 1][0]);
document.getElementById("jobs").appendChild(probe);
const svg = probe.querySelector("svg.chart"), line = svg.querySelector("path.line").getBoundingClientRect();
const ticks = [...svg.querySelectorAll('text[data-axis="y"]')].map((t) => {
  const r = t.getBoundingClientRect();
  return {text: t.textContent, value: Number(t.dataset.value), at: r.top + r.height / 2};
});
probe.remove();
return {top: Number(svg.dataset.top), ticks, line: {top: line.top, bottom: line.bottom}};
"""

NUMBER = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})*(?:\.([0-9]+))?")


def decimals(text):
    """How many decimals the number that starts ``text`` has; None for "–"; fails on a number not in the page's
    one format (commas grouping thousands, a point before the decimals)."""
    if text in ("–", "—"):
        return None
    m = NUMBER.match(text)
    assert m and not re.match(r"[0-9,.]", text[m.end() :]), f"not in the page's number format: {text!r}"
    return len(m.group(1) or "")


@pytest.mark.parametrize("width", [1400, 800, 500])
def test_the_page_fits_the_window_and_labels_what_it_draws(tmp_path, width):
    """At 1,400 and 800 px, with a GPU throttling for heat (the widest throttle text): every column of every table is
    on screen, cell by cell (a hit test lands on it, nothing scrolls sideways, no text runs out of its cell); a table
    too wide for the window is set smaller or stacked into label-value pairs rather than cut off, and at 1,400 px none
    needs to be; at 500 px the GPU and fabric tables are stacked, each value beside its column's name.
    Each headline says what it is (MFU by the formula, or the hardware estimate in smaller type), with what it means;
    the chart has percent and time tick labels, its scale reaches the data and at least 60 %, and its baseline and 25 %
    lines sit where their values fall on that scale; the cause says how long it has held, from the API's ``since``.
    Numbers share one format: commas for thousands and one count of decimals per column."""
    with running_demo("--incident", "thermal", speed=20) as base:
        wait_until(
            lambda: (
                (jobs := {j["job"]: j for j in get_json(base + "api/v1/jobs")["jobs"]}).get("llama3-70b", {}).get("mfu")
                and ((jobs.get("bert-pretrain") or {}).get("hardware") or {}).get("headline") is not None
            ),
            30,
            "llama3-70b to have an MFU and bert-pretrain a hardware estimate",
        )
        causes = []  # (cause, since, the exporter's time) of llama3-70b, as the API gave them while the page ran

        def poll():
            status = get_json(base + "api/v1/status")
            job = next(j for j in status["jobs"] if j["job"] == "llama3-70b")
            causes.append(
                ((job["bottleneck"] or {}).get("cause"), (job["bottleneck"] or {}).get("since"), status["time"])
            )
            return status

        with browser(tmp_path, width) as page:
            page.get(base)
            gpu1_throttled = (
                "return [...document.querySelectorAll('div[data-table=gpus] tbody tr')]"
                ".some((tr) => tr.cells[0].textContent === '1' && tr.textContent.includes('hw_thermal_slowdown'))"
            )
            llama_cause = "return !!document.querySelector('.card[data-job=\"llama3-70b\"] .cause time.since')"
            wait_until(
                lambda: poll() and page.execute(gpu1_throttled) and page.execute(llama_cause),
                60,
                "the page to show GPU 1 throttled for heat and a cause for llama3-70b",
            )
            drawn = page.execute(MEASURE)
            poll()
            history = poll()["history"]
            page.screenshot(tmp_path / f"status-page-{width}.png")
            # The page's own chart() on figures above 70 % (the demo's stay below): the scale grows to hold them.
            high = [
                [t, 0.5 + t / 1000, None, 0.9 + t / 2000] for t in range(0, 420, 60)
            ]  # MFU to 0.86, estimate to 1.08
            scaled = {kind: page.execute(CHART, high, kind, 0.8) for kind in ("mfu", "hardware")}

    assert drawn["innerWidth"] == width, drawn["innerWidth"]
    viewport = drawn["viewport"]
    assert drawn["scrollWidth"] <= viewport, f"the page scrolls sideways: {drawn['scrollWidth']} > {viewport}"

    tables = {t["name"]: t for t in drawn["tables"]}
    assert set(tables) == {"gpus", "fabric", "sources", "logs"}, sorted(tables)
    for name, t in tables.items():
        headers = [h["text"] for h in t["headers"]]
        assert t["rows"], name
        if width >= 1400:
            assert not t["stacked"] and not t["compact"], f"{name}: squeezed at {width} px, where a table fits"
        if width <= 500 and name in ("gpus", "fabric"):
            assert t["stacked"], f"{name}: not stacked at {width} px, where its columns cannot fit"
        for h in t["headers"] if not t["stacked"] else []:
            assert h["seen"] and h["width"] > 0 and 0 <= h["left"] and h["right"] <= viewport + 0.5, (name, h)
        for row in t["rows"]:
            assert [c["label"] for c in row] == headers, (name, headers, [c["label"] for c in row])
            for c in row:
                where = (name, c["label"], c["text"], width, "stacked" if t["stacked"] else "table")
                assert c["width"] > 0 and c["height"] > 0 and c["seen"], where
                assert 0 <= c["left"] and c["right"] <= viewport + 0.5, (*where, c["left"], c["right"])
                assert c["overflow"] <= 1, (*where, "text runs out of its cell", c["overflow"])
                if t["stacked"]:  # the column's name is drawn beside each value
                    assert c["before"] == json.dumps(c["label"]), (*where, c["before"])
        for i, header in enumerate(headers):  # one count of decimals down each column of numbers
            column = [row[i]["text"] for row in t["rows"] if "num" in row[i]["cls"].split()]
            # A duration of a minute or more is whole units ("1 m 17 s"); under a minute, seconds with a decimal.
            long = [text for text in column if re.match(r"[0-9]+ [hm] ", text) and read_duration(text) >= 60]
            kinds = {decimals(text) for text in column if text not in long} - {None}
            assert len(kinds) <= 1, (name, header, column)
    gpus, fabric = tables["gpus"], tables["fabric"]
    assert {"throttle", "temp", "power"} <= {h["text"] for h in gpus["headers"]}
    assert {"errors", "storm events", "CNP/s", "pause ratio"} <= {h["text"] for h in fabric["headers"]}
    throttle = [h["text"] for h in gpus["headers"]].index("throttle")
    gpu1 = next(row for row in gpus["rows"] if row[0]["text"] == "1")
    assert "hw_thermal_slowdown" in gpu1[throttle]["text"] and gpu1[throttle]["seen"]

    jobs = {j["job"]: j for j in drawn["jobs"]}
    llama, bert = jobs["llama3-70b"], jobs["bert-pretrain"]
    assert llama["kind"] == "mfu" and llama["label"] == "MFU, by the formula" and llama["labelSeen"]
    assert "tokens/s" in llama["what"] and "peak FLOP/s" in llama["what"], llama["what"]
    assert bert["kind"] == "hardware" and bert["label"] == "Hardware estimate, not MFU" and bert["labelSeen"]
    assert "4 GPUs" in bert["what"] and "reads above MFU" in bert["what"], bert["what"]
    assert bert["size"] < llama["size"], "the estimate is set in MFU's type"
    for job in jobs.values():  # every figure the page formats in the card: one decimal for a percentage
        assert re.fullmatch(r"[0-9]+\.[0-9]%", job["figure"]), job["figure"]
        for field, text in job["facts"]:
            for number in re.findall(r"[0-9][0-9,.]*%", text):
                assert decimals(number) == 1, (job["job"], field, text)

    # The cause, with how long it has held: the API's since, counted on the exporter's clock.
    cause = llama["cause"]
    assert cause["since"] and cause["since"]["seen"], cause
    assert (cause["cause"], cause["since"]["value"]) in {(c, s) for c, s, _ in causes}, (cause, causes[-3:])
    since = cause["since"]["value"]
    assert (
        cause["since"]["datetime"]
        == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since)) + f".{int(since * 1000) % 1000:03d}Z"
    )
    held = re.fullmatch(r"for (.+)", cause["since"]["text"])
    assert held, cause["since"]["text"]
    assert 0 <= read_duration(held.group(1)) <= max(t for _, _, t in causes) - since + 1, (held.group(1), since)
    assert f"low: {cause['cause']} {cause['since']['text']}" in cause["text"]

    for job in jobs.values():
        chart = job["chart"]
        assert chart, f"{job['job']}: no chart"
        # Percent ticks from 0 to the top of the scale, which reaches 60 % and the figures drawn, and is no more than
        # a tick above the highest of them.
        ys = chart["y"]
        assert [t["text"] for t in ys] == [f"{round(100 * t['value'])}%" for t in ys] and ys[0]["value"] == 0, ys
        assert ys[-1]["value"] == chart["scale"] >= 0.6
        column = 1 if job["kind"] == "mfu" else 3
        served = [p[column] for p in history[job["job"]] if p[column] is not None]
        baseline = chart["refs"].get("baseline", {}).get("value", 0)
        step = ys[1]["value"] - ys[0]["value"]
        assert chart["scale"] < max(0.6, baseline, *served) + step + 0.05, (job["job"], chart["scale"], max(served))
        zero, top = ys[0]["at"], ys[-1]["at"]
        assert top - 1 <= chart["line"]["top"] and chart["line"]["bottom"] <= zero + 1, "the line leaves the scale"
        # Each reference line at its value on the scale.
        on_scale = lambda v: zero + (top - zero) * v / chart["scale"]  # noqa: E731
        assert abs(chart["refs"]["low"]["at"] - on_scale(0.25)) <= 1.5, chart["refs"]
        assert "baseline" in chart["refs"] and abs(chart["refs"]["baseline"]["at"] - on_scale(baseline)) <= 1.5
        assert any(label.startswith("baseline ") for label in chart["refLabels"]) and any(
            label.startswith("25% ") for label in chart["refLabels"]
        ), chart["refLabels"]
        # Time ticks back from "now", each label inside the chart and on screen.
        xs = chart["x"]
        assert (
            len(xs) >= 2 and xs[0]["text"] == "now" and all(re.fullmatch(r"−[0-9]+ [hms]", t["text"]) for t in xs[1:])
        ), xs
        assert all(x["seconds"] < y["seconds"] for x, y in zip(xs, xs[1:]))
        for t in xs + ys:
            assert chart["left"] - 0.5 <= t["left"] and t["right"] <= min(chart["right"], viewport) + 0.5, (
                job["job"],
                t,
            )
    for kind, highest in (("mfu", 0.86), ("hardware", 1.08)):
        drawn_high = scaled[kind]
        ticks = drawn_high["ticks"]
        assert ticks[-1]["value"] == drawn_high["top"] and highest <= drawn_high["top"] < highest + 0.2, (
            kind,
            drawn_high,
        )
        assert ticks[-1]["text"] == f"{round(100 * drawn_high['top'])}%", ticks
        assert ticks[-1]["at"] - 1 <= drawn_high["line"]["top"], (kind, "the line runs above the scale", drawn_high)
