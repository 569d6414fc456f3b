"""Property tests: whatever a client sends to an ingest API, and whatever a config file holds, the answer is a clear
4xx or a success (a ConfigError for files), never a 500 or a traceback, and a rejected request changes nothing."""

import asyncio
import json
import math
import re
import subprocess
import sys
import threading

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from mfu_exporter.config import JOB_NAME_PATTERN, ConfigError, defaults, load_config, validate
from mfu_exporter.service import build_service
from mfu_exporter.sources import Paths, SourceContext, build_sources
from mfu_exporter.web.app import create_app
from mfu_exporter.web.webconfig import load_web_config

MAX_JOBS = 3
MAX_BODY = 4096
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

huge_numbers = st.sampled_from([10**400, -(10**400), 2**53 + 1, 2**64, -1, -0.0, 1e308, -1e308, 5e-324, 1e21, 1e22])
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | huge_numbers
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(["70B", "1e400", "-5", "nan", "inf", "7e10", "", "\x00", "\u202e", "started"])
)


# Strategies take named functions, not lambdas: Hypothesis describes a lambda by parsing its source with ast, which
# CPython 3.11 can fail with a SystemError deep in a stack ("AST constructor recursion depth mismatch").
def json_containers(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)


json_values = st.recursive(leaves, json_containers, max_leaves=16)
job_names = st.one_of(
    st.sampled_from(["llama", "a", "x" * 128, "x" * 129, "../../etc", "job\nname", "jöb", "j b", "-x", ""]),
    st.text(max_size=140),
    st.from_regex(JOB_NAME_PATTERN, fullmatch=True),
)


def shaped(fields, nested=None):
    """Objects with the API's own keys (so validation goes deep) holding anything at all."""
    values = {name: json_values for name in fields}
    values["job"] = job_names | json_values
    if nested:
        values[nested[0]] = st.fixed_dictionaries({}, optional={k: json_values for k in nested[1]}) | json_values
    return st.fixed_dictionaries({}, optional=values)


def mutated(valid, fields, nested=None):
    """Valid bodies with up to two fields (top level or nested) replaced by anything: reaches every validator."""
    top = st.dictionaries(st.sampled_from(fields), json_values | job_names, max_size=2)
    inner = st.dictionaries(st.sampled_from(nested[1]), json_values, max_size=2) if nested else st.just({})

    def apply(parts):
        body, replaced, replaced_inner = parts
        body = {**body, **replaced}
        if replaced_inner and isinstance(body.get(nested[0]), dict):
            body[nested[0]] = {**body[nested[0]], **replaced_inner}
        return body

    return st.tuples(valid, top, inner).map(apply)


# A few names, so reports meet existing jobs as well as the job cap.
valid_jobs = st.sampled_from(["llama", "gpt-4o", "mix:tral@2"]) | st.from_regex(JOB_NAME_PATTERN, fullmatch=True)
recent = st.floats(1.5e9, 1.7e9)
PROGRESS_FIELDS = [
    "job",
    "tokens_total",
    "step",
    "time",
    "model",
    "dtype",
    "gpus",
    "target_tokens",
    "peak_tflops",
    "expected_mfu",
]
MODEL_FIELDS = ["params", "layers", "heads", "head_dim", "seq_len", "causal_attention"]
valid_progress = st.fixed_dictionaries(
    {"job": valid_jobs, "tokens_total": st.integers(0, 10**15) | st.floats(0, 1e15)},
    optional={
        "step": st.integers(0, 10**9),
        "time": recent,
        "gpus": st.integers(1, 8) | st.just([0, 1]),
        "dtype": st.sampled_from(["bf16", "fp8"]),
        "peak_tflops": st.sampled_from([989.4, "989"]),
        "model": st.fixed_dictionaries(
            {"params": st.sampled_from(["70B", 7e10, "8.5e9", 1])},
            optional={
                "layers": st.integers(1, 200),
                "heads": st.integers(1, 128),
                "head_dim": st.integers(1, 256),
                "seq_len": st.integers(1, 10**6),
                "causal_attention": st.booleans(),
            },
        ),
    },
)
CHECKPOINT_FIELDS = ["job", "checkpoint", "phase", "time", "bytes", "duration_seconds", "ok"]
checkpoint_names = st.text(st.characters(min_codepoint=0x20, blacklist_categories=["Cs"]), min_size=1, max_size=30)
valid_checkpoint = st.one_of(
    st.fixed_dictionaries(
        {"job": valid_jobs, "checkpoint": checkpoint_names, "duration_seconds": st.floats(0, 86400)},
        optional={"bytes": st.integers(0, 2**50), "time": recent},
    ),
    st.fixed_dictionaries(
        {
            "job": valid_jobs,
            "checkpoint": checkpoint_names,
            "phase": st.sampled_from(["started", "finished", "failed"]),
        },
        optional={"time": recent},
    ),
)

INGEST_BODIES = {
    "/api/v1/progress": mutated(valid_progress, PROGRESS_FIELDS, ("model", MODEL_FIELDS))
    | shaped(PROGRESS_FIELDS[1:], ("model", MODEL_FIELDS)),
    "/api/v1/checkpoints": mutated(valid_checkpoint, CHECKPOINT_FIELDS) | shaped(CHECKPOINT_FIELDS[1:]),
}


class Exporter:
    """A real app on a loopback test server, its event loop running in a thread so hypothesis can drive it from a
    sync test while the daemon samples in the background as it does in production."""

    def __init__(self, tmp_path):
        config = validate(
            {
                "ingest": {"max_jobs": MAX_JOBS, "max_body_bytes": MAX_BODY},
                # The checkpoint source, where it exists, owns the checkpoint API; the hardware sources stay off.
                "sources": {
                    name: {"enabled": "true" if name == "checkpoint" else "false"} for name in defaults()["sources"]
                },
            }
        )
        ctx = SourceContext(config, Paths(str(tmp_path), str(tmp_path)))
        self.service = build_service(config, build_sources(config, ctx))
        self.app = create_app(self.service)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop", daemon=True)
        self.thread.start()
        self.client = self.run(self._start())
        self.posts = [r.resource.canonical for r in self.app.router.routes() if r.method == "POST"]
        self.ticks = [0, 0]  # checkpoint ticks begun, ended
        checkpoints = getattr(self.service, "checkpoints", None)
        if checkpoints is not None:
            checkpoints.tick = self._counting(checkpoints.tick)

    def _counting(self, tick):
        """The tracker's tick, counted as it begins and ends. A write started at a time long past (the API accepts
        any) times out at the next background tick: a change no request made, so a check spanning a tick is void."""

        def counted():
            self.ticks[0] += 1
            try:
                return tick()
            finally:
                self.ticks[1] += 1

        return counted

    def quiet_since(self, ticks: list[int]) -> bool:
        """No tick ran, even in part, between ``ticks`` (a copy of ``self.ticks``) and now."""
        return ticks[0] == ticks[1] and self.ticks == ticks

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    async def _start(self):
        client = TestClient(TestServer(self.app))
        await client.start_server()
        return client

    def post(self, path, body: bytes):
        async def send():
            response = await self.client.post(path, data=body, headers={"Content-Type": "application/json"})
            return response.status, await response.read()

        return self.run(send())

    def get(self, path):
        async def fetch():
            response = await self.client.get(path)
            return await response.text()

        return self.run(fetch())

    def state(self):
        checkpoints = getattr(self.service, "checkpoints", None)
        return (
            self.service.jobs.generation,
            sorted(self.service.jobs.names()),
            repr(checkpoints.totals()) if checkpoints is not None else None,
        )

    def close(self):
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def exporter(tmp_path):
    server = Exporter(tmp_path)
    yield server
    server.close()


def check_answer(exporter, path, body: bytes):
    ticks = list(exporter.ticks)
    before = exporter.state()
    status, raw = exporter.post(path, body)
    assert status < 500, (status, raw)
    if status >= 400:
        payload = json.loads(raw)
        assert isinstance(payload["error"], str) and payload["error"].strip(), raw
        after = exporter.state()
        if exporter.quiet_since(ticks):  # else a background tick may have changed it, legitimately
            assert after == before, f"a rejected request ({status} {payload}) changed state"
    else:
        assert 200 <= status < 300


def encode(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN and Infinity go out as the bare tokens JSON forbids


def test_the_ingest_apis_exist(exporter):
    assert "/api/v1/progress" in exporter.posts
    assert set(exporter.posts) <= set(INGEST_BODIES), "a new ingest API: give it a body strategy here"


@pytest.mark.parametrize("path", list(INGEST_BODIES))
def test_ingest_shaped_bodies_get_a_clear_4xx_or_success(exporter, path):
    if path not in exporter.posts:
        pytest.skip(f"{path} is not served by this build")

    @FUZZ
    @given(body=INGEST_BODIES[path])
    def check(body):
        check_answer(exporter, path, encode(body))

    check()


@pytest.mark.parametrize("path", list(INGEST_BODIES))
def test_ingest_arbitrary_json_and_bytes_get_a_clear_4xx_or_success(exporter, path):
    if path not in exporter.posts:
        pytest.skip(f"{path} is not served by this build")

    @FUZZ
    @given(body=json_values.map(encode) | st.binary(max_size=MAX_BODY + 64))
    @example(body=b"[" * 3000 + b"]" * 3000)
    @example(body=b'{"a":' * 1500 + b"1" + b"}" * 1500)
    @example(body=b"9" * 5000)
    @example(body=b'{"job": "llama", "tokens_total": 1e999}')
    @example(body=b'{"job": "llama", "tokens_total": ' + b"9" * 400 + b"}")
    @example(body=b'\xef\xbb\xbf{"job": "llama", "tokens_total": 1}')
    @example(body=b'{"job": "llama", "tokens_total": 1, "job": "other"}')
    @example(body=b'{"job": "llama\\u0000", "tokens_total": 1}')
    def check(body):
        check_answer(exporter, path, body)

    check()


def test_no_sequence_of_reports_creates_unbounded_series(exporter):
    @settings(max_examples=40, deadline=None)
    @given(reports=st.lists(st.tuples(job_names, st.integers(0, 10**12)), max_size=12))
    def check(reports):
        for name, tokens in reports:
            exporter.post("/api/v1/progress", encode({"job": name, "tokens_total": tokens}))
        names = exporter.service.jobs.names()
        assert len(names) <= MAX_JOBS
        assert all(JOB_NAME_PATTERN.match(name) for name in names)
        families = text_string_to_metric_families(exporter.get("/metrics"))
        labelled = {s.labels["training_job"] for f in families for s in f.samples if "training_job" in s.labels}
        assert labelled <= set(names)

    check()


def test_checkpoint_names_are_bounded(exporter):
    if "/api/v1/checkpoints" not in exporter.posts:
        pytest.skip("/api/v1/checkpoints is not served by this build")
    for name, accepted in (("c" * 256, True), ("c" * 257, False), ("step\n1", False), ("", False)):
        status, _ = exporter.post(
            "/api/v1/checkpoints", encode({"job": "llama", "checkpoint": name, "duration_seconds": 1})
        )
        assert (status == 200) is accepted, (name, status)


# --- the config loaders: a ConfigError (exit 2 with one line), never a traceback -------------------------------------

CONFIG_KEYS = [
    "web",
    "listen_address",
    "config_file",
    "sources",
    "gpu",
    "rdma",
    "ethtool",
    "checkpoint",
    "enabled",
    "interval",
    "timeout",
    "watch",
    "path",
    "job",
    "devices_include",
    "mfu",
    "window",
    "jobs",
    "llama",
    "params",
    "layers",
    "gpus",
    "dtype",
    "peak_tflops",
    "expected_mfu",
    "ingest",
    "token_file",
    "max_jobs",
    "job_ttl",
]
WEB_KEYS = [
    "tls_server_config",
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_ca_file",
    "client_auth_type",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "http_server_config",
    "headers",
    "X-Frame-Options",
    "basic_auth_users",
    "alice",
    "rate_limit",
    "burst",
    "interval",
    "http2",
]
config_leaves = leaves | st.sampled_from(
    [
        "auto",
        "true",
        "30s",
        "-1s",
        "1e400",
        "[",
        ":9495",
        "TLS13",
        "(",
        "a{99999999999}",
        "RequireAndVerifyClientCert",
        "$2y$04$" + "a" * 53,
    ]
)


def yaml_bytes(document) -> bytes:
    return yaml.safe_dump(document, allow_unicode=True).encode()


def config_documents(keys):
    key = st.sampled_from(keys) | st.text(max_size=8) | st.integers() | st.none()

    def containers(inner):
        return st.lists(inner, max_size=3) | st.dictionaries(key, inner, max_size=4)

    return st.recursive(config_leaves, containers, max_leaves=20)


@FUZZ
@given(document=config_documents(CONFIG_KEYS))
@example(document={"jobs": {"llama": {"params": 10**400}}})
@example(document={"mfu": {"window": 10**400}})
@example(document={"sources": {"rdma": {"devices_include": ["a{99999999999}"]}}})
@example(document={"jobs": {"llama": {"params": float("nan"), "gpus": [float("inf")]}}})
def test_the_config_validator_raises_config_error_or_accepts(document):
    try:
        validate(document, "fuzz.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yaml: ")


@pytest.mark.parametrize(
    "load,keys", [(load_config, CONFIG_KEYS), (load_web_config, WEB_KEYS)], ids=["config", "web-config"]
)
def test_config_files_of_any_content_raise_config_error_or_load(tmp_path, load, keys):
    path = tmp_path / "fuzz.yaml"

    @FUZZ
    @given(
        content=st.binary(max_size=300) | st.text(max_size=300).map(str.encode) | config_documents(keys).map(yaml_bytes)
    )
    @example(content=b"[" * 5000)
    @example(content=b"a: &x [*x]\n")
    @example(content=b"\xff\xfe\x00")
    def check(content):
        path.write_bytes(content)
        try:
            load(str(path))
        except ConfigError as exc:
            assert str(exc).startswith(f"{path}: ")

    check()


def test_a_garbage_config_exits_2_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "garbage.yaml"
    path.write_bytes(b"jobs:\n  llama:\n    params: " + b"9" * 400 + b"\nweb: \xff\n")
    result = subprocess.run(
        [sys.executable, "-m", "mfu_exporter", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"mfu-exporter: {path}: ")
    assert math.isfinite(len(line)) and re.search(r"expected", line)
