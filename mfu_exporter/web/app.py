"""HTTP: /metrics, the landing page, health endpoints and the ingest API. Knows nothing about NVML or sysfs."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import signal
import socket
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping
from urllib.parse import quote

from aiohttp import web

from mfu_exporter import VERSION_HEADER, __version__
from mfu_exporter.service import CHECKPOINTS_OFF, IngestError, Service, ValidationError
from mfu_exporter.web.security import HTTP_LIMITS, WEB_SECURITY, WebSecurity

log = logging.getLogger(__name__)

SERVICE = web.AppKey("service", Service)
DOUBLE_DIGITS = 309  # sys.float_info.max has 309 integer digits


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    payload: dict[str, Any] = {"error": message}
    if field is not None:
        payload["field"] = field
    return web.json_response(payload, status=status)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _double_range_int(text: str) -> int:
    """Integers beyond a double's range (I-JSON's limit) would overflow the float conversions validation does.
    Their digits are counted first: Python refuses to convert over 4,300 digits, in words of its own."""
    if len(text.lstrip("-")) > DOUBLE_DIGITS:
        raise ValueError(f"the number {text[:16]}... ({len(text)} digits) is beyond the range of a double")
    number = int(text)
    if abs(number) > sys.float_info.max:
        raise ValueError(f"the number {text[:16]}... is beyond the range of a double")
    return number


def _double_range_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"the number {text[:16]}... is beyond the range of a double")
    return number


# One decoder for every body: ``json.loads`` with hooks would build a decoder and its scanner per request.
_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_int=_double_range_int, parse_float=_double_range_float
)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; raises ValidationError (→ 400) for anything that is not valid JSON."""
    raw = await request.read()
    try:
        return _DECODER.decode(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValidationError("", "the body must be UTF-8 JSON") from None
    except ValueError as exc:
        raise ValidationError("", f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # the decoder recurses once per level; no report nests more than a few
        raise ValidationError("", "the body nests arrays or objects too deeply") from None


@web.middleware
async def api_errors(request: web.Request, handler):
    """Map the job model's refusals to JSON 4xx answers, each naming its field; and a body over the limit to 413.
    Every answer to a report, taken or refused, says the daemon's version: the client compares it with its own. The
    security middleware runs first, so only a caller it let through (the ingest token) learns the version."""
    try:
        response = await handler(request)
    except IngestError as exc:
        response = _error(exc.status, exc.message, exc.field)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SERVICE].settings.ingest.max_body_bytes
        response = _error(413, f"the body is larger than the limit of {limit} bytes (ingest.max_body_bytes)")
    if request.method == "POST":
        response.headers[VERSION_HEADER] = __version__
    return response


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body, headers = await service.metrics(request.headers.get("Accept"), request.headers.get("Accept-Encoding"))
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[SERVICE].ready:
        return web.Response(text="ready\n")
    return web.Response(text="not ready: no sample cycle has completed yet\n", status=503)


async def post_progress(request: web.Request) -> web.Response:
    """Validation and a state update only: the answer is small (accepted, the job, its state, run and version) and
    links to the job's full JSON, which the job model computes once per tick rather than once per report."""
    answer = request.app[SERVICE].ingest_progress(await read_json(request))
    links, link = job_links(answer["job"])
    return web.json_response({**answer, "links": links}, headers={"Link": link})


@functools.lru_cache(maxsize=1024)  # a node holds at most ingest.max_jobs reporting jobs: their links are few
def job_links(name: str) -> tuple[dict[str, str], str]:
    """Where a job's JSON and ledger are, and the ``Link`` header naming the first."""
    job = quote(name, safe="")
    links = {"job": f"/api/v1/jobs/{job}", "ledger": f"/api/v1/jobs/{job}/ledger"}
    return links, f'<{links["job"]}>; rel="related"'


async def post_checkpoint(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.accepts_checkpoints:
        return _error(404, CHECKPOINTS_OFF)
    return web.json_response(service.ingest_checkpoint(await read_json(request)))


async def get_jobs(request: web.Request) -> web.Response:
    return web.json_response({"jobs": request.app[SERVICE].jobs_json()})


async def get_job(request: web.Request) -> web.Response:
    """``GET /api/v1/jobs/<job>``: the job's JSON as ``/api/v1/jobs`` lists it (what ``POST /api/v1/progress``
    answered before it answered with a link here)."""
    return web.json_response(request.app[SERVICE].job(request.match_info["job"]))


async def get_ledger(request: web.Request) -> web.Response:
    """``GET /api/v1/jobs/<job>/ledger``: where the job's time on this node went (``kinds``: GPU-seconds by kind),
    its ``goodput`` and its ``runs`` (start, first step, end and why), with the bands of the status page's timeline."""
    return web.json_response(request.app[SERVICE].ledger_json(request.match_info["job"]))


async def get_status(request: web.Request) -> web.Response:
    return web.json_response({**request.app[SERVICE].status(), "web_config": request.app[WEB_SECURITY].status()})


STATIC = Path(__file__).parent / "static"


async def status_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def service_lifespan(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the service samples and ticks from the app's startup to its cleanup."""
    async with app[SERVICE].running():
        yield


async def security_lifespan(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the password checker's threads end with the app."""
    yield
    await app[WEB_SECURITY].close()


def json_document(read: Callable[[], Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A GET handler answering what ``read()`` returns, as JSON."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(read())

    return handler


def create_app(
    service: Service, security: WebSecurity | None = None, documents: Mapping[str, Callable[[], Any]] | None = None
) -> web.Application:
    """The routes and middlewares over ``service``; its resources start and stop with the app through
    ``cleanup_ctx`` (aiohttp's lifespan), so nothing runs until the app starts. ``documents``: more read-only JSON
    routes (path -> what to answer) that whoever hosts the service adds, behind the same security, such as the
    demo's truth at ``/api/v1/demo``; the web layer knows nothing of what they say."""
    # From the config unless a test injects one; a bad web config raises ConfigError here, so exit 2 at start.
    security = security or WebSecurity.from_config(service.settings)
    app = web.Application(
        middlewares=[security.middleware, api_errors], client_max_size=service.settings.ingest.max_body_bytes
    )
    app[SERVICE] = service
    app[WEB_SECURITY] = security
    app.cleanup_ctx.extend((security_lifespan, service_lifespan))
    app.on_response_prepare.append(security.add_headers)
    app.router.add_get("/", status_page)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_post("/api/v1/progress", post_progress)
    app.router.add_post("/api/v1/checkpoints", post_checkpoint)
    app.router.add_get("/api/v1/jobs", get_jobs)
    app.router.add_get("/api/v1/jobs/{job}", get_job)
    app.router.add_get("/api/v1/jobs/{job}/ledger", get_ledger)
    app.router.add_get("/api/v1/status", get_status)
    for path, read in (documents or {}).items():
        app.router.add_get(path, json_document(read))
    return app


def split_listen_address(address: str) -> tuple[str | None, int]:
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    return (host or None), int(port)


def listening_sockets(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (every interface when None), as asyncio's create_server
    binds them: SO_REUSEADDR, IPv6 sockets IPv6 only. OSError when any cannot be bound; none is left open then."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def serve(
    service: Service,
    on_started: Callable[[list[str]], None] | None = None,
    stop: asyncio.Event | None = None,
    documents: Mapping[str, Callable[[], Any]] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop``), then shut down within a few seconds; ``documents`` as create_app's."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service.export_process_metrics()  # the daemon's own CPU and memory, beside what it measures
    app = create_app(service, documents=documents)
    security = app[WEB_SECURITY]
    host, port = split_listen_address(service.settings.web.listen_address)
    ssl_context = security.server_ssl_context()
    # The port is bound before the app starts, and with it the sources: a port in use is one line and exit, with no
    # source thread started to fail behind it.
    try:
        sockets = await loop.run_in_executor(None, listening_sockets, host, port)
    except OSError as exc:
        await security.close()
        raise SystemExit(
            f"mfu-exporter: cannot listen on {service.settings.web.listen_address}: {exc.strerror or exc}"
        ) from None
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, access_log=None, **HTTP_LIMITS)
    await runner.setup()
    for sock in sockets:
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    urls = [f"{scheme}://{'localhost' if host in (None, '0.0.0.0', '::') else host}:{port}/"]
    log.info("mfu-exporter %s listening on %s (%s)", __version__, service.settings.web.listen_address, scheme)
    security.warn_if_exposed(service.settings.web.listen_address)
    if on_started:
        on_started(urls)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()
