"""Cluster sizing with the guide's model: t_train = FLOPs/token · D / (N · T_peak · MFU), FLOPs/token ≈ 6·P.

``mfu-exporter plan`` prints wall-clock time, GPU-hours and cost at the planned MFU and at the guide's 25% and
50%, so what a bottleneck costs is visible before a job starts; with ``--time`` it solves for the GPUs (or the
MFU) that a deadline needs instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Callable

from mfu_exporter.config import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_PARAMS,
    MAX_PEAK_TFLOPS,
    MAX_SEQ_LEN,
    MAX_TOKENS,
    MIN_PEAK_TFLOPS,
)
from mfu_exporter.model import flops as mfu
from mfu_exporter.quantities import format_duration, parse_duration, parse_quantity

MAX_PLAN_GPUS = 100_000_000  # far above any cluster (the largest are a few hundred thousand GPUs)
MAX_PRICE_PER_GPU_HOUR = 1e6
GUIDE_MFUS = (0.25, 0.50)  # the guide: sub-25% when the fabric or storage stalls, 45–55% achievable
DEFAULT_MFU = 0.40


class PlanError(ValueError):
    """A bad combination of inputs, worded for the command line."""


@dataclass(frozen=True)
class Scenario:
    mfu: float
    seconds: float
    gpu_hours: float
    cost: float | None


@dataclass(frozen=True)
class Plan:
    params: float
    tokens: float
    flops_per_token: float
    gpus: int
    gpu: str  # what the peak came from, e.g. "h100-sxm bf16" or "--peak-tflops"
    peak_flops: float  # per GPU
    mfu: float  # the planned MFU (given, or solved for)
    scenarios: tuple[Scenario, ...]
    target_seconds: float | None = None
    solved: str | None = None  # "gpus" or "mfu" when --time asked for one

    @property
    def total_flops(self) -> float:
        return self.flops_per_token * self.tokens

    def as_json(self) -> dict:
        return {
            "params": self.params,
            "tokens": self.tokens,
            "flops_per_token": self.flops_per_token,
            "total_flops": self.total_flops,
            "gpus": self.gpus,
            "gpu": self.gpu,
            "peak_flops_per_gpu": self.peak_flops,
            "mfu": self.mfu,
            "target_seconds": self.target_seconds,
            "solved": self.solved,
            "scenarios": [
                {
                    "mfu": s.mfu,
                    "seconds": s.seconds,
                    "days": s.seconds / 86400,
                    "gpu_hours": s.gpu_hours,
                    "cost": s.cost,
                }
                for s in self.scenarios
            ],
        }


def peak_per_gpu(gpu: str | None, dtype: str, peak_tflops: float | None) -> tuple[float, str]:
    """Dense FLOP/s of one GPU and where the figure came from; ``peak_tflops`` overrides the table."""
    if peak_tflops is not None:
        return peak_tflops * 1e12, f"{peak_tflops:g} TFLOP/s (--peak-tflops)"
    if gpu is None:
        raise PlanError("give --gpu (a key of the peak table) or --peak-tflops")
    model = mfu.gpu_model_by_key(gpu)
    if model is None:
        raise PlanError(f"unknown --gpu {gpu!r}; known: {known_gpus()} (or give --peak-tflops)")
    if dtype not in model.tflops:
        raise PlanError(
            f"the table has no {dtype} peak for {model.key} (it has {', '.join(model.tflops)}); give --peak-tflops"
        )
    return model.tflops[dtype] * 1e12, f"{model.key} {dtype}, {model.tflops[dtype]:g} TFLOP/s dense"


def known_gpus() -> str:
    """The peak table's keys, each with the aliases that name it: ``h100-sxm (h100, h100-sxm5), h200 (h200-sxm)``."""
    aliases: dict[str, list[str]] = {}
    for alias, key in mfu.GPU_ALIASES.items():
        aliases.setdefault(key, []).append(alias)
    return ", ".join(m.key + (f" ({', '.join(aliases[m.key])})" if m.key in aliases else "") for m in mfu.PEAK_TABLE)


def scenario(
    flops_per_token: float, tokens: float, gpus: int, peak: float, mfu_ratio: float, price_per_gpu_hour: float | None
) -> Scenario:
    seconds = mfu.training_seconds(flops_per_token, tokens, gpus, peak, mfu_ratio)
    gpu_hours = gpus * seconds / 3600
    return Scenario(
        mfu_ratio, seconds, gpu_hours, None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour
    )


def make_plan(
    shape: mfu.ModelShape,
    tokens: float,
    peak: float,
    gpu_label: str,
    gpus: int | None = None,
    mfu_ratio: float | None = None,
    target_seconds: float | None = None,
    price_per_gpu_hour: float | None = None,
) -> Plan:
    """The planned scenario first, then the guide's MFUs. With ``target_seconds``, exactly one of ``gpus`` and
    ``mfu_ratio`` may be given and the other is solved for (GPUs rounded up; MFU may come out above 1: unreachable)."""
    per_token = mfu.flops_per_token(shape)
    solved = None
    if target_seconds is not None:
        if gpus is not None and mfu_ratio is not None:
            raise PlanError("with --time, give --gpus (to solve for MFU) or --mfu (to solve for GPUs), not both")
        if gpus is None:
            mfu_ratio = DEFAULT_MFU if mfu_ratio is None else mfu_ratio
            # t = F·D/(N·T·MFU), so N = t(N=1)/t_target
            gpus = math.ceil(mfu.training_seconds(per_token, tokens, 1, peak, mfu_ratio) / target_seconds)
            solved = "gpus"
        else:
            mfu_ratio = mfu.training_seconds(per_token, tokens, gpus, peak, 1.0) / target_seconds
            solved = "mfu"
    if gpus is None:
        raise PlanError("give --gpus, or --time to solve for the GPUs a deadline needs")
    mfu_ratio = DEFAULT_MFU if mfu_ratio is None else mfu_ratio
    ratios = [mfu_ratio] + [m for m in GUIDE_MFUS if not math.isclose(m, mfu_ratio)]
    scenarios = tuple(scenario(per_token, tokens, gpus, peak, m, price_per_gpu_hour) for m in ratios)
    return Plan(shape.params, tokens, per_token, gpus, gpu_label, peak, mfu_ratio, scenarios, target_seconds, solved)


def _si(value: float) -> str:
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _money(value: float) -> str:
    return f"${_si(value)}" if value >= 1e6 else f"${value:,.0f}"


def render_plan(plan: Plan) -> str:
    lines = [
        f"model      {_si(plan.params)} parameters, {_si(plan.tokens)} tokens, {plan.flops_per_token:.3g} FLOPs/token",
        f"compute    {plan.total_flops:.3g} FLOPs",
        f"cluster    {plan.gpus:,} GPUs × {plan.gpu}",
    ]
    if plan.solved == "gpus":
        lines.append(
            f"deadline   {format_duration(plan.target_seconds)} at {plan.mfu:.0%} MFU needs {plan.gpus:,} GPUs"
        )
    elif plan.solved == "mfu":
        reach = "" if plan.mfu <= 1 else " (above 100%: unreachable; add GPUs or time)"
        lines.append(
            f"deadline   {format_duration(plan.target_seconds)} on {plan.gpus:,} GPUs needs {plan.mfu:.1%} MFU{reach}"
        )
    lines.append("")
    header = ["MFU", "wall-clock", "GPU-hours", "vs plan"]
    with_cost = plan.scenarios[0].cost is not None
    if with_cost:
        header.append("cost")
    rows = []
    base = plan.scenarios[0]
    for index, s in enumerate(plan.scenarios):
        delta = (
            ""
            if index == 0
            else f"{'+' if s.seconds >= base.seconds else '-'}{format_duration(abs(s.seconds - base.seconds))}"
        )
        label = f"{s.mfu:.1%}" if plan.solved == "mfu" and index == 0 else f"{s.mfu:.0%}"
        row = [label + (" (plan)" if index == 0 else " (guide)"), format_duration(s.seconds), _si(s.gpu_hours), delta]
        if with_cost:
            row.append(_money(s.cost))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------------------------


def _quantity(value: str) -> float:
    try:
        number = parse_quantity(value)
    except ValueError as exc:
        if value.strip().startswith("-"):
            raise argparse.ArgumentTypeError(f"{value!r}: must be positive") from None
        raise argparse.ArgumentTypeError(str(exc)) from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be positive")
    return number


def bounded(low: float, high: float, what: str) -> Callable[[str], float]:
    """A positive quantity within the bounds the daemon holds a job's facts to (mfu_exporter/config/), so every figure
    the plan derives from it stays finite."""

    def parse(value: str) -> float:
        number = _quantity(value)
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value!r}: {what} must be from {low:g} to {high:g}")
        return number

    return parse


def _gpus(value: str) -> int:
    number = bounded(1, MAX_PLAN_GPUS, "GPUs")(value)
    if number != int(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of GPUs")
    return int(number)


def _ratio(value: str) -> float:
    try:
        number = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a ratio like 0.40 or 40%") from None
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be above 0 and at most 1 (100%)")
    return number


def _duration(value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive duration like 60d")
    return seconds


def _attention(value: str) -> tuple[int, int, int, int]:
    parts = value.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            "expected layers,heads,head_dim,seq_len as four positive integers, e.g. 126,128,128,8192"
        )
    layers, heads, head_dim, seq_len = (int(p) for p in parts)
    limits = (MAX_LAYERS, MAX_HEADS, MAX_HEAD_DIM, MAX_SEQ_LEN)
    if any(v > limit for v, limit in zip((layers, heads, head_dim, seq_len), limits)):
        raise argparse.ArgumentTypeError(
            f"layers,heads,head_dim,seq_len must be at most {','.join(f'{x:g}' for x in limits)}"
        )
    return layers, heads, head_dim, seq_len


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params", type=bounded(1, MAX_PARAMS, "parameters"), required=True, help="active parameters, e.g. 405B"
    )
    parser.add_argument(
        "--tokens", type=bounded(1, MAX_TOKENS, "tokens"), required=True, help="training tokens, e.g. 15.6T"
    )
    parser.add_argument("--gpus", type=_gpus, help="GPUs in the cluster (omit with --time to solve for it)")
    parser.add_argument("--gpu", help=f"GPU model, a key of the peak table: {known_gpus()}")
    parser.add_argument("--dtype", choices=mfu.DTYPES, default="bf16", help="training precision (default bf16)")
    parser.add_argument(
        "--peak-tflops",
        type=bounded(MIN_PEAK_TFLOPS, MAX_PEAK_TFLOPS, "TFLOP/s per GPU"),
        help="dense TFLOP/s per GPU, overriding the table",
    )
    parser.add_argument("--mfu", type=_ratio, help=f"planned MFU, e.g. 0.40 or 40%% (default {DEFAULT_MFU:.2f})")
    parser.add_argument(
        "--attention",
        type=_attention,
        metavar="L,H,Q,T",
        help="layers,heads,head_dim,seq_len: adds the attention term 12·L·H·Q·T to 6·P",
    )
    parser.add_argument(
        "--causal-attention", action="store_true", help="halve the attention term (Megatron's convention)"
    )
    parser.add_argument(
        "--price-per-gpu-hour",
        type=bounded(1e-6, MAX_PRICE_PER_GPU_HOUR, "the price"),
        metavar="USD",
        help="adds a cost column",
    )
    parser.add_argument(
        "--time",
        type=_duration,
        metavar="DURATION",
        help="a deadline such as 60d: solve for the GPUs (no --gpus) or the MFU (with --gpus) it needs",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run_plan(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout  # looked up per call, so a captured stdout is the one written to
    layers, heads, head_dim, seq_len = args.attention or (None, None, None, None)
    shape = mfu.ModelShape(args.params, layers, heads, head_dim, seq_len, args.causal_attention)
    try:
        peak, label = peak_per_gpu(args.gpu, args.dtype, args.peak_tflops)
        plan = make_plan(shape, args.tokens, peak, label, args.gpus, args.mfu, args.time, args.price_per_gpu_hour)
    except PlanError as exc:
        print(f"mfu-exporter plan: {exc}", file=sys.stderr)
        return 2
    try:  # the inputs' bounds keep every figure finite; this refuses rather than print inf or NaN if one is not
        text = json.dumps(plan.as_json(), indent=2, allow_nan=False)
    except ValueError:
        print("mfu-exporter plan: these inputs give figures beyond a double's range", file=sys.stderr)
        return 2
    out.write((text if args.json else render_plan(plan)) + "\n")
    return 0
