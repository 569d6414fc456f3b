import os
import shutil
import threading

import pytest
from prometheus_client.core import GaugeMetricFamily

from exporter.config import validate
from exporter.service import build_service
from exporter.sources.base import Snapshot, SourceUnavailable
from exporter.web.app import create_app


def require_tool(tool: str, package: str) -> str:
    """The path of a Debian tool a test drives. Missing in CI is a failure (make test installs it); elsewhere a skip."""
    path = shutil.which(tool)
    if path:
        return path
    message = f"{tool} not found: `make test` installs Debian's {package} (run it as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class ScriptedSource:
    """A source whose behaviour each test sets: a value, an outage, or a call that blocks until released."""

    def __init__(self, name="fake", interval=0.05, timeout=0.2):
        self.name, self.interval, self.timeout = name, interval, timeout
        self.value = 1.0
        self.unavailable: SourceUnavailable | None = None
        self.release = threading.Event()
        self.release.set()
        self.calls = 0
        self.closed = False

    def sample(self):
        self.calls += 1
        self.release.wait()
        if self.unavailable:
            raise self.unavailable
        value = self.value

        def render():
            family = GaugeMetricFamily("mfu_fake_value", "A value from the scripted test source.")
            family.add_metric([], value)
            yield family

        return Snapshot(render=render, status={"value": value})

    def close(self):
        self.closed = True
        self.release.set()


@pytest.fixture
def scripted_source():
    source = ScriptedSource()
    yield source
    source.release.set()


@pytest.fixture
def make_client(aiohttp_client):
    """An aiohttp test client around a real exporter app built from ``config`` and ``sources``."""

    async def make(config=None, sources=()):
        runtime = build_service(validate(config or {}), list(sources))
        client = await aiohttp_client(create_app(runtime))
        client.runtime = runtime
        return client

    return make
