"""The shipped rules and Alertmanager routing on a clock ``speed`` times faster, for a demo run at ``--speed``.

A demo at ``--speed S`` lives S simulated seconds per wall second, while Prometheus and Alertmanager keep the wall
clock. Compressing their time by the same factor keeps every judgement the rules make the same in demo time:

- every duration is divided by S: range windows (``[5m]``), subquery ranges and steps (``[1h:1m]``), ``offset``,
  ``for:``, ``keep_firing_for:``, a group's ``interval:``; Prometheus's scrape and evaluation intervals, its
  lookback delta (a series' staleness) and its alert resend delay; Alertmanager's ``group_wait``,
  ``group_interval``, ``repeat_interval`` and ``resolve_timeout``. A window holds as many scrapes as it would at
  full time (a 5-minute window of 15 s scrapes: 20), so ``rate()`` and ``increase()`` see the same samples;
- ``rate()``, ``irate()`` and ``deriv()`` are divided by S: a counter of demo seconds, tokens or pause time grows S
  times faster per wall second, and the rules compare per-demo-second rates (MFU, a pause share, CNPs/s) with
  thresholds; ``increase()`` and the ``*_over_time`` functions count or compare values and need nothing;
- ``time()`` reads the demo's clock, ``S · time() − (S − 1) · origin`` (the demo's clock agrees with the wall
  clock at ``origin`` and runs S times faster), since the rules compare it with the demo's own timestamps.

Nothing else changes: names, labels, matchers, thresholds, annotations, the routing tree. A function whose answer
depends on the wall clock in another way (``timestamp``, ``predict_linear``, the calendar functions, ``@``) is
refused rather than scaled wrongly.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
RATES = ("rate", "irate", "deriv")  # per-second values: divided by the speed
REFUSED = (
    "timestamp",
    "predict_linear",
    "holt_winters",
    "double_exponential_smoothing",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "hour",
    "minute",
    "month",
    "year",
)
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def seconds(duration: str) -> float:
    """A Prometheus duration (``1h30m``, ``500ms``) in seconds."""
    if not DURATION.fullmatch(duration):
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * UNITS[unit] for n, unit in DURATION_PART.findall(duration))


def scale_duration(duration: str, speed: float) -> str:
    """``duration`` divided by ``speed``, in whole milliseconds (at least 1)."""
    return f"{max(round(seconds(duration) * 1000 / speed), 1)}ms"


def _string_end(text: str, start: int) -> int:
    """The index after the PromQL string literal that opens at ``start``."""
    quote, index = text[start], start + 1
    while index < len(text):
        if text[index] == "\\" and quote != "`":
            index += 2
            continue
        if text[index] == quote:
            return index + 1
        index += 1
    raise ValueError(f"unterminated string in {text!r}")


def _call_end(text: str, open_paren: int) -> int:
    """The index after the parenthesis that closes the one at ``open_paren`` (strings skipped)."""
    depth, index = 0, open_paren
    while index < len(text):
        char = text[index]
        if char in "\"'`":
            index = _string_end(text, index)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ValueError(f"unbalanced parentheses in {text!r}")


def scale_expr(expr: str, speed: float, origin: float) -> str:
    """A PromQL expression on the clock ``speed`` times faster, which agrees with the wall clock at ``origin``."""
    out: list[str] = []
    index = 0
    while index < len(expr):
        char = expr[index]
        if char in "\"'`":
            end = _string_end(expr, index)
            out.append(expr[index:end])
            index = end
        elif char == "#":
            end = expr.find("\n", index)
            end = len(expr) if end < 0 else end
            out.append(expr[index:end])
            index = end
        elif char == "@":
            raise ValueError(f"the @ modifier reads the wall clock: {expr!r}")
        elif char == "[":
            end = expr.index("]", index)
            inside = expr[index + 1 : end].strip()
            parts = [part.strip() for part in inside.split(":")]
            if len(parts) > 2:
                raise ValueError(f"not a range or subquery: [{inside}]")
            out.append("[" + ":".join(scale_duration(p, speed) if p else p for p in parts) + "]")
            index = end + 1
        elif (match := IDENTIFIER.match(expr, index)) and (index == 0 or not expr[index - 1].isalnum()):
            word = match.group(0)
            after = match.end()
            rest = expr[after:]
            if word == "offset":
                duration = re.match(r"\s*(-?)(" + DURATION.pattern + ")", rest)
                if not duration:
                    raise ValueError(f"offset without a duration in {expr!r}")
                out.append(f"offset {duration.group(1)}{scale_duration(duration.group(2), speed)}")
                index = after + duration.end()
                continue
            call = re.match(r"\s*\(", rest)
            if call and word in REFUSED:
                raise ValueError(f"{word}() reads the wall clock, which the demo's speed does not scale: {expr!r}")
            if call and word == "time" and re.match(r"\s*\(\s*\)", rest):
                close = after + re.match(r"\s*\(\s*\)", rest).end()
                out.append(f"({speed:g} * time() - {speed - 1:g} * {origin:.3f})" if speed != 1 else "time()")
                index = close
            elif call and word in RATES:
                close = _call_end(expr, after + call.end() - 1)
                inner = scale_expr(expr[after:close], speed, origin)
                out.append(f"({word}{inner} / {speed:g})" if speed != 1 else word + inner)
                index = close
            else:
                out.append(word)
                index = after
        else:
            out.append(char)
            index += 1
    return "".join(out)


def scale_rules(document: dict, speed: float, origin: float) -> dict:
    """A rule file's groups on the faster clock: expressions, ``for:``, ``keep_firing_for:``, ``interval:``."""
    scaled = copy.deepcopy(document)
    for group in scaled["groups"]:
        if "interval" in group:
            group["interval"] = scale_duration(group["interval"], speed)
        for rule in group["rules"]:
            rule["expr"] = scale_expr(rule["expr"], speed, origin)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = scale_duration(rule[key], speed)
    return scaled


def scaled_rule_file(source: Path, dest: Path, speed: float, origin: float) -> Path:
    dest.write_text(yaml.safe_dump(scale_rules(yaml.safe_load(source.read_text()), speed, origin), sort_keys=False))
    return dest


ROUTE_DURATIONS = ("group_wait", "group_interval", "repeat_interval")
ROUTE_DEFAULTS = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}  # Alertmanager's own


def _scale_route(route: dict, speed: float, top: bool) -> None:
    for key in ROUTE_DURATIONS:
        if key in route:
            route[key] = scale_duration(route[key], speed)
        elif top:
            route[key] = scale_duration(ROUTE_DEFAULTS[key], speed)  # the child routes inherit these
    for child in route.get("routes", []):
        _scale_route(child, speed, top=False)


def scale_alertmanager(config: dict, speed: float, webhook: str) -> dict:
    """An Alertmanager config on the faster clock, its receivers posting to ``webhook``/<receiver name> instead of
    their services (a receiver with no integration, the blackhole, keeps none); routes and inhibitions as given."""
    scaled = copy.deepcopy(config)
    _scale_route(scaled["route"], speed, top=True)
    scaled.setdefault("global", {})["resolve_timeout"] = scale_duration(
        scaled.get("global", {}).get("resolve_timeout", "5m"), speed
    )
    for receiver in scaled["receivers"]:
        integrations = [key for key in receiver if key.endswith("_configs")]
        for key in integrations:
            del receiver[key]
        if integrations:
            receiver["webhook_configs"] = [
                {"url": f"{webhook.rstrip('/')}/{receiver['name']}", "send_resolved": True, "max_alerts": 0}
            ]
    return scaled


def prometheus_timing(speed: float, scrape: str = "15s", evaluation: str = "15s") -> dict[str, Any]:
    """Prometheus's global intervals and flags on the faster clock: the shipped 15 s scrape and evaluation
    (deploy/fleet/prometheus-shard.yaml), the 5-minute lookback and the 1-minute alert resend delay."""
    return {
        "scrape_interval": scale_duration(scrape, speed),
        "evaluation_interval": scale_duration(evaluation, speed),
        "flags": [
            f"--query.lookback-delta={scale_duration('5m', speed)}",
            f"--rules.alert.resend-delay={scale_duration('1m', speed)}",
            f"--rules.alert.for-grace-period={scale_duration('10m', speed)}",
        ],
    }
