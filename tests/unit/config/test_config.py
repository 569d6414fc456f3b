import dataclasses
import subprocess
import sys

import pytest

from mfu_exporter.config import (
    DEFAULTS,
    Config,
    ConfigError,
    Enabled,
    defaults,
    load_config,
    model_facts,
    typed_config,
    validate,
)
from mfu_exporter.model.attribution import Thresholds
from mfu_exporter.model.errors import ValidationError
from mfu_exporter.model.jobs import JobTracker
from mfu_exporter.model.progress import ProgressReport, parse_progress
from mfu_exporter.preflight.facts import PreflightSettings
from mfu_exporter.quantities import parse_duration, parse_quantity


@pytest.mark.parametrize(
    "text,value", [("70B", 70e9), ("8.5e9", 8.5e9), ("15T", 15e12), ("1.5k", 1500), (7e10, 7e10), ("405 B", 405e9)]
)
def test_quantities(text, value):
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text,value", [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), (15, 15), ("2", 2.0), ("60d", 5184000)]
)
def test_durations(text, value):
    assert parse_duration(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["seventy", "", "-5", "1e400", True, [1], "nan"])
def test_bad_quantities(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_defaults_fill_every_key():
    config = defaults()
    assert config["web"]["listen_address"] == ":9495"
    assert config["mfu"]["window"] == 60
    assert config["ingest"] == {"token_file": None, "max_jobs": 32, "max_body_bytes": 65536, "job_ttl": 86400.0}
    for source in ("gpu", "rdma", "ethtool", "checkpoint"):
        assert config["sources"][source]["enabled"] == "auto"
    # Every source samples every 5 s, and the job model is evaluated as often.
    for source in ("gpu", "rdma", "ethtool", "checkpoint", "nccl", "storage", "logs"):
        assert config["sources"][source]["interval"] == 5.0
    assert config["mfu"]["interval"] == 5.0


def test_human_forms_in_jobs():
    config = validate(
        {
            "jobs": {"llama3-70b": {"params": "70.6B", "target_tokens": "15T", "gpus": [0, "GPU-abc"]}},
            "mfu": {"window": "30s"},
        }
    )
    job = config["jobs"]["llama3-70b"]
    assert job["params"] == pytest.approx(70.6e9)
    assert job["target_tokens"] == 15e12
    assert job["gpus"] == [0, "GPU-abc"]
    assert job["dtype"] == "bf16"
    assert config["mfu"]["window"] == 30


@pytest.mark.parametrize(
    "raw,message",
    [
        (
            {"jobs": {"llama": {"params": "seventy"}}},
            'config.yaml: jobs.llama.params: expected a number like 7e10 or "70B", got "seventy"',
        ),
        (
            {"sources": {"gpu": {"intreval": "5s"}}},
            "config.yaml: sources.gpu.intreval: unknown key; expected one of enabled, interval",
        ),
        (
            {"mfu": {"window": "soon"}},
            'config.yaml: mfu.window: expected a duration like "30s", "5m" or "1h", got "soon"',
        ),
        (
            {"sources": {"rdma": {"enabled": "maybe"}}},
            'config.yaml: sources.rdma.enabled: expected one of auto, true, false, got "maybe"',
        ),
        ({"web": {"listen_address": "9495"}}, 'config.yaml: web.listen_address: expected HOST:PORT such as ":9495"'),
        ({"jobs": {"bad name": {}}}, "config.yaml: jobs.bad name: expected the name to be a job name"),
        ({"jobs": {"x": {"gpus": 0}}}, "config.yaml: jobs.x.gpus: expected a GPU count like 8"),
        (
            {"jobs": {"x": {"gpus": [0, 1, 0]}}},
            "config.yaml: jobs.x.gpus: expected each GPU listed once, like [0, 1, 2, 3] "
            "(0 is listed twice), got [0, 1, 0]",
        ),
        (
            {"jobs": {"x": {"dtype": "int4"}}},
            'config.yaml: jobs.x.dtype: expected one of bf16, fp16, fp8, tf32, got "int4"',
        ),
        ({"ingest": {"max_jobs": -1}}, "config.yaml: ingest.max_jobs: expected a positive whole number, got -1"),
        (
            {"sources": {"rdma": {"devices_include": ["("]}}},
            "config.yaml: sources.rdma.devices_include[0]: expected a valid regular expression",
        ),
        (
            {"sources": {"checkpoint": {"watch": [{"job": "x"}]}}},
            "config.yaml: sources.checkpoint.watch[0].path: expected a non-empty string",
        ),
        (["a list"], 'config.yaml: expected a mapping of keys, got ["a list"]'),
    ],
)
def test_config_errors_name_file_key_and_form(raw, message):
    with pytest.raises(ConfigError) as caught:
        validate(raw, "config.yaml")
    assert str(caught.value).startswith(message)


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("web:\n  listen_address: [\n")
    with pytest.raises(ConfigError, match=r"config.yaml: expected valid YAML \(line"):
        load_config(str(path))


def test_example_config_loads():
    config = load_config("examples/config.yaml")
    assert config["jobs"]["llama3-70b"]["seq_len"] == 8192
    # node-local, like the tokens a job reports: Llama 3's 15T over an 8-GPU node of a 1,024-GPU job
    assert config["jobs"]["llama3-70b"]["target_tokens"] == pytest.approx(15e12 * 8 / 1024, rel=1e-3)


def test_cli_exits_2_with_one_clear_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("jobs:\n  llama:\n    params: seventy\n")
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f'mfu-exporter: {path}: jobs.llama.params: expected a number like 7e10 or "70B", got "seventy"'
    )


def test_cli_rejects_bad_listen_flag():
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "run", "--web.listen-address", "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--web.listen-address: expected HOST:PORT" in result.stderr


def test_the_typed_config_is_the_validated_one_as_frozen_sections():
    config = validate(
        {
            "sources": {
                "gpu": {"enabled": True, "interval": "2s"},
                "rdma": {"devices_include": ["^mlx5_0$"]},
                "checkpoint": {"watch": [{"path": "/ckpt", "job": "llama", "poll": False}]},
            },
            "jobs": {"llama": {"params": "70B", "gpus": [0, 1]}},
            "discovery": {"slurm": {"enabled": "false"}},
        }
    )
    typed = typed_config(config)
    assert typed.sources.gpu.enabled is Enabled.TRUE and typed.sources.gpu.interval == 2.0
    assert typed.sources.rdma.enabled is Enabled.AUTO
    assert typed.sources.rdma.devices_include == ("^mlx5_0$",)  # lists become tuples
    (watch,) = typed.sources.checkpoint.watch
    assert (watch.path, watch.job, watch.poll, watch.quiet_period) == ("/ckpt", "llama", Enabled.FALSE, 30.0)
    assert typed.jobs["llama"].params == 70e9 and typed.jobs["llama"].gpus == (0, 1)
    assert typed.discovery.slurm.enabled is Enabled.FALSE
    # The dicts carry the same Enabled, equal to the file's strings, as consumers of the dicts compare them.
    assert config["sources"]["gpu"]["enabled"] == "true" and config["sources"]["gpu"]["enabled"] is Enabled.TRUE
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.sources.gpu.interval = 5.0  # type: ignore[misc]


def test_defaults_are_written_once_in_the_table():
    assert typed_config(defaults()) == DEFAULTS == Config()
    # The classes that once restated them take them from the table.
    assert Thresholds() == DEFAULTS.attribution
    preflight = PreflightSettings()
    for name in PreflightSettings.__dataclass_fields__:
        assert getattr(preflight, name) == getattr(DEFAULTS.sources.preflight, name), name
    tracker = JobTracker()
    assert (tracker.window, tracker.max_jobs, tracker.job_ttl) == (60.0, 32, 86400.0)
    assert (DEFAULTS.mfu.window, DEFAULTS.ingest.max_jobs, DEFAULTS.ingest.job_ttl) == (60.0, 32, 86400.0)


def test_a_tri_state_is_rejected_in_the_same_words_as_before(tmp_path):
    with pytest.raises(ConfigError) as raised:
        validate({"sources": {"gpu": {"enabled": "yes"}}}, "node.yaml")
    assert str(raised.value) == 'node.yaml: sources.gpu.enabled: expected one of auto, true, false, got "yes"'
    assert f"{Enabled.AUTO}" == str(Enabled.AUTO) == "auto"


def test_peak_flops_is_a_per_device_peak_in_flops_that_the_job_model_takes_as_its_peak():
    """A CPU (or any device the GPU table lacks) gets an MFU from a peak declared in FLOP/s per device."""
    config = validate({"jobs": {"cpu-job": {"params": 5e5, "gpus": 2, "peak_flops": "50G"}}})
    job = config["jobs"]["cpu-job"]
    assert job["peak_flops"] == 5e10
    assert typed_config(config).jobs["cpu-job"].peak_flops == 5e10
    facts = model_facts(job)
    assert facts["peak_tflops"] == pytest.approx(0.05) and "peak_flops" not in facts
    # The job model: 2 devices of 5e10 FLOP/s, no GPU table entry needed; 6 x 5e5 x 1e4 tokens/s = 3e10 FLOP/s.
    now = [1000.0]
    jobs = JobTracker(configured={"cpu-job": facts}, window=60, clock=lambda: now[0])
    for tokens in (0.0, 1e5):
        jobs.report(ProgressReport("cpu-job", tokens, None, now[0], {}), view=False)
        now[0] += 10
    (view,) = jobs.views()
    assert view.peak_flops == pytest.approx(1e11)
    assert view.mfu == pytest.approx(0.3)


@pytest.mark.parametrize(
    "job,message",
    [
        (
            {"peak_flops": 5e10, "peak_tflops": 0.05},
            "config.yaml: jobs.x.peak_flops: expected one peak: peak_flops (FLOP/s) or peak_tflops (TFLOP/s), not both",
        ),
        ({"peak_flops": 100}, "config.yaml: jobs.x.peak_flops: expected a number from 1e+09 to 1e+18"),
        ({"peak_flops": "fast"}, 'config.yaml: jobs.x.peak_flops: expected a number like 7e10 or "70B"'),
    ],
)
def test_peak_flops_is_refused_out_of_bounds_or_beside_peak_tflops(job, message):
    with pytest.raises(ConfigError) as caught:
        validate({"jobs": {"x": job}}, "config.yaml")
    assert str(caught.value).startswith(message)


def test_the_progress_api_does_not_take_peak_flops():
    """Reports keep one spelling of the peak (peak_tflops); peak_flops is the config's."""
    with pytest.raises(ValidationError) as caught:
        parse_progress({"job": "x", "tokens_total": 1, "peak_flops": 5e10}, now=1000.0)
    assert caught.value.field == "peak_flops"
