"""MFU arithmetic: FLOPs per token, the dense peak table, live MFU and the guide's training-time model.

FLOPs per token = 6·P (the guide), plus the PaLM appendix B attention term 12·L·H·Q·T when the job gives its
shape, halved for causal attention (Megatron's convention since 2025-03). Peaks are dense tensor throughput
(never the 2:4-sparse datasheet figure) per GPU at boost clock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

DTYPES = ("bf16", "fp16", "fp8", "tf32")


@dataclass(frozen=True)
class GpuModel:
    """One row of the peak table: ``patterns`` are lower-case substrings of the NVML device name, all of which must match."""

    key: str
    patterns: tuple[str, ...]
    tflops: dict[str, float]
    # The reference tensor clock of the hardware estimate (tensor active × SM clock ÷ this): the SM clock at which
    # tensor activity 1.0 would reach the dense bf16 peak. The datasheet's (peak ÷ SMs ÷ FLOP per clock: 1830 MHz for
    # H100) unless measured: the H200's is calibrated against a CUDA-event-timed bf16 GEMM (docs/benchmarks.md).
    peak_clock_mhz: float | None = None


# Most specific first: GB200 before B200, GH200 before H200, H200 NVL before H200, L40S before L40 before L4.
# Figures: dense (no 2:4 sparsity) per GPU at boost clock, from the vendors' datasheets as PyTorch Lightning
# (lightning/fabric/utilities/throughput.py, _CUDA_FLOPS) and torchtitan (get_peak_flops) carry them.
PEAK_TABLE: tuple[GpuModel, ...] = (
    GpuModel("gb200", ("gb200",), {"bf16": 2500, "fp16": 2500, "fp8": 5000, "tf32": 1250}),
    GpuModel("gb300", ("gb300",), {"bf16": 2500, "fp16": 2500}),
    GpuModel("b300", ("b300",), {"bf16": 2250, "fp16": 2250}),
    GpuModel("b200", ("b200",), {"bf16": 2250, "fp16": 2250, "fp8": 4500, "tf32": 1100}),
    GpuModel("b100", ("b100",), {"bf16": 1750, "fp16": 1750, "fp8": 3500, "tf32": 875}),
    GpuModel("gh200", ("gh200",), {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7}, 1830),
    GpuModel("h200-nvl", ("h200", "nvl"), {"bf16": 835.5, "fp16": 835.5, "fp8": 1671, "tf32": 417.5}),
    # Measured on a real H200: 8192³ bf16 products at 662.6 TFLOP/s showed tensor active 0.927 at 1485 MHz (power
    # capped), so 0.927 × 1485 ÷ (662.6 ÷ 989.4) = 2056 MHz; the datasheet's 1830 read 11.6 % high.
    GpuModel("h200", ("h200",), {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7}, 2056),
    GpuModel("h100-nvl", ("h100", "nvl"), {"bf16": 835.5, "fp16": 835.5, "fp8": 1671, "tf32": 417.5}),
    GpuModel("h100-pcie", ("h100", "pcie"), {"bf16": 756, "fp16": 756, "fp8": 1513, "tf32": 378}),
    GpuModel("h100-sxm", ("h100",), {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7}, 1830),
    GpuModel("h20", ("h20",), {"bf16": 148, "fp16": 148, "fp8": 296, "tf32": 74}),
    GpuModel("a100", ("a100",), {"bf16": 312, "fp16": 312, "tf32": 156}, 1410),
    GpuModel("l40s", ("l40s",), {"bf16": 362, "fp16": 362, "fp8": 733, "tf32": 183}),
    GpuModel("l40", ("l40",), {"bf16": 181, "fp16": 181, "fp8": 362, "tf32": 90.5}),
    GpuModel("l4", ("l4",), {"bf16": 121, "fp16": 121, "fp8": 242.5, "tf32": 60}),
    GpuModel("a10", ("a10",), {"bf16": 125, "fp16": 125, "tf32": 62.5}),
    GpuModel("v100s", ("v100s",), {"fp16": 130}),
    GpuModel("v100-pcie", ("v100", "pcie"), {"fp16": 112}),
    GpuModel("v100", ("v100",), {"fp16": 125}),
    GpuModel("mi325x", ("mi325x",), {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7}),
    GpuModel("mi300x", ("mi300x",), {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7}),
)

# Keys accepted by ``plan --gpu`` besides the table keys.
GPU_ALIASES = {"h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h200-sxm": "h200", "a100-sxm": "a100", "a100-pcie": "a100"}


@functools.lru_cache(maxsize=256)  # a job's view asks for each of its GPUs at every report; a node has a few names
def gpu_model(device_name: str) -> GpuModel | None:
    """The table row for an NVML device name, most specific match first; None when unknown."""
    name = device_name.lower()
    for model in PEAK_TABLE:
        if all(p in name for p in model.patterns):
            return model
    return None


def gpu_model_by_key(key: str) -> GpuModel | None:
    key = GPU_ALIASES.get(key.lower(), key.lower())
    return next((m for m in PEAK_TABLE if m.key == key), None)


def peak_flops(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense tensor FLOP/s of one GPU for ``dtype``; None when the GPU or the dtype is not in the table."""
    model = gpu_model(device_name)
    if model is None or dtype not in model.tflops:
        return None
    return model.tflops[dtype] * 1e12


@dataclass(frozen=True)
class ModelShape:
    """What the formula needs of a model. Only ``params`` (active parameters, for MoE) is required."""

    params: float
    layers: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    seq_len: int | None = None
    causal_attention: bool = False

    @property
    def attention_shape(self) -> tuple[int, int, int, int] | None:
        """(layers, heads, head_dim, seq_len) when all four are known."""
        if self.layers is None or self.heads is None or self.head_dim is None or self.seq_len is None:
            return None
        return self.layers, self.heads, self.head_dim, self.seq_len

    @property
    def has_attention_shape(self) -> bool:
        return self.attention_shape is not None


def flops_per_token(shape: ModelShape) -> float:
    """6·P, plus 12·L·H·Q·T when the attention shape is known (halved for causal attention)."""
    flops = 6.0 * shape.params
    dims = shape.attention_shape
    if dims is not None:
        layers, heads, head_dim, seq_len = dims
        attention = 12.0 * layers * heads * head_dim * seq_len
        flops += attention / 2 if shape.causal_attention else attention
    return flops


def model_flops_utilization(flops_per_token_: float, tokens_per_second: float, peak_flops_total: float) -> float:
    """Achieved model FLOP/s over the peak of the GPUs that produced them (a ratio, 0–1 when healthy)."""
    return flops_per_token_ * tokens_per_second / peak_flops_total


def training_seconds(
    flops_per_token_: float, tokens: float, gpus: float, peak_flops_per_gpu: float, mfu: float
) -> float:
    """The guide's t_train = 6·P·D / (N·T_peak·MFU), with 6·P generalised to FLOPs per token."""
    return flops_per_token_ * tokens / (gpus * peak_flops_per_gpu * mfu)
