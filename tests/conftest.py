import pytest

from mfu_exporter.config import validate
from mfu_exporter.service import build_service
from mfu_exporter.web.app import create_app
from tests.support.sources import ScriptedSource


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite tests/fixtures/e2e-output.txt from the live rendering instead of comparing with it",
    )
    parser.addoption(
        "--update-screenshot",
        action="store_true",
        help="write docs/img/status-page.png, the README's picture of the status page, from the demo in Chromium",
    )


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.fixture
def scripted_source():
    source = ScriptedSource()
    yield source
    source.release.set()


@pytest.fixture
def make_client(aiohttp_client):
    """An aiohttp test client around a real exporter app built from ``config`` and ``sources``."""

    async def make(config=None, sources=()):
        service = build_service(validate(config or {}), list(sources))
        client = await aiohttp_client(create_app(service))
        client.service = service
        return client

    return make


def pytest_terminal_summary(terminalreporter):
    """The share of real pasted training-log progress lines read right, after any run that included
    their tests: in the controller, so it shows under ``make test``'s ``-q -n`` as well."""
    ran = any(
        "test_real_pastes.py" in getattr(report, "nodeid", "")
        for reports in terminalreporter.stats.values()
        for report in reports
    )
    if ran:
        from tests.unit.logs import real_pastes

        terminalreporter.write_line(real_pastes.summary_line(real_pastes.share()))
