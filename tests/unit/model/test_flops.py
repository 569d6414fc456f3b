import pytest

from mfu_exporter.model import flops as mfu


def test_palm_540b_reproduces_published_mfu():
    shape = mfu.ModelShape(params=540.35e9, layers=118, heads=48, head_dim=256, seq_len=2048)
    per_token = mfu.flops_per_token(shape)
    assert per_token == pytest.approx(6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048)
    assert mfu.model_flops_utilization(per_token, 238.3e3, 6144 * 275e12) == pytest.approx(0.462, abs=0.0005)


def test_six_p_without_shape_and_causal_halving():
    assert mfu.flops_per_token(mfu.ModelShape(params=7e9)) == 42e9
    full = mfu.flops_per_token(mfu.ModelShape(params=1, layers=2, heads=3, head_dim=4, seq_len=5))
    causal = mfu.flops_per_token(
        mfu.ModelShape(params=1, layers=2, heads=3, head_dim=4, seq_len=5, causal_attention=True)
    )
    assert full == 6 + 12 * 120
    assert causal == 6 + 6 * 120


@pytest.mark.parametrize(
    "name,key,bf16",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm", 989.4),
        ("NVIDIA H100 PCIe", "h100-pcie", 756),
        ("NVIDIA H100 NVL", "h100-nvl", 835.5),
        ("NVIDIA H200", "h200", 989.4),
        ("NVIDIA H200 NVL", "h200-nvl", 835.5),
        ("NVIDIA GH200 480GB", "gh200", 989.4),
        ("NVIDIA B200", "b200", 2250),
        ("NVIDIA GB200", "gb200", 2500),
        ("NVIDIA L40S", "l40s", 362),
        ("NVIDIA L4", "l4", 121),
        ("NVIDIA A10", "a10", 125),
        ("NVIDIA A100-SXM4-80GB", "a100", 312),
        ("AMD Instinct MI300X", "mi300x", 1307.4),
    ],
)
def test_peak_table_most_specific_first(name, key, bf16):
    model = mfu.gpu_model(name)
    assert model.key == key
    assert mfu.peak_flops(name, "bf16") == pytest.approx(bf16 * 1e12)


def test_peak_is_dense_and_per_dtype():
    assert mfu.peak_flops("NVIDIA H100 80GB HBM3", "fp8") == pytest.approx(1978.9e12)
    assert mfu.peak_flops("NVIDIA H100 80GB HBM3", "tf32") == pytest.approx(494.7e12)
    assert mfu.peak_flops("Tesla V100-SXM2-32GB", "fp16") == pytest.approx(125e12)


def test_unknown_gpu_or_dtype_gives_no_peak():
    assert mfu.gpu_model("NVIDIA Quantum Toaster") is None
    assert mfu.peak_flops("NVIDIA Quantum Toaster") is None
    assert mfu.peak_flops("Tesla V100-SXM2-32GB", "bf16") is None  # Volta has no bf16 tensor cores


def test_training_time_llama3_405b():
    seconds = mfu.training_seconds(6 * 405e9, 15.6e12, 16384, 989e12, 0.40)
    assert seconds / 86400 == pytest.approx(67.7, abs=0.05)
