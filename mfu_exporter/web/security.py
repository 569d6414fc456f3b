"""Who may talk to the exporter, and how much.

* The exporter-toolkit web config (``--web.config.file``), so operators reuse the file they already write for
  node_exporter: TLS with version bounds and mTLS, bcrypt basic auth, extra response headers and a rate limit. The
  file and the certificate files it names are checked (``stat``) on every request and every TLS handshake, so a
  rotated certificate, a new user or a removed one takes effect without a restart.
* Ingest auth: writes need ``Authorization: Bearer <token>`` when ``ingest.token_file`` is set, and are taken only
  from loopback otherwise, so nobody off this node can forge a job's progress (and with it MFU) without the token.
  Basic auth governs reads; the training-side client sends a bearer token, never a person's password.
* Limits chosen on purpose: header sizes, keep-alive, how long an ingest request may take and how many run at once,
  so a slow or hostile client cannot pin the server.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import bcrypt
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from mfu_exporter.config import Config, ConfigError
from mfu_exporter.web.webconfig import (
    NO_WEB_CONFIG,
    RETRY_SECONDS,
    Reloading,
    TlsSettings,
    WebConfig,
    load_ingest_token,
    load_web_config,
)

log = logging.getLogger(__name__)

_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+


class OneLineClientErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line over ``max_line_size``, a bad header) at ERROR with
    a traceback, so any client could fill the log. A client's mistake is one WARNING line here, cut short."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            detail = " ".join(str(exc.message).split())
            record.msg, record.args = "%s: %d %s", (record.getMessage(), exc.code, detail[:160])
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


PROTOCOL_LOG = logging.getLogger("mfu_exporter.web.protocol")
PROTOCOL_LOG.addFilter(OneLineClientErrors())

# Handed to aiohttp's request handler through AppRunner. Each is a decision, not a library default.
HTTP_LIMITS: dict[str, Any] = {
    "logger": PROTOCOL_LOG,  # the handler's own log: malformed requests as one line each (OneLineClientErrors)
    "max_line_size": 4096,  # the request line: every URL served here is short
    "max_field_size": 8190,  # one header: room for a browser's cookies for localhost next to Authorization
    "max_headers": 64,
    # aiohttp arms this when a connection opens and again after each response, so it also bounds how long a client
    # may take to send its request headers (slowloris). Longer than the common 15 s and 30 s scrape intervals, so
    # Prometheus keeps its connection and TLS session between scrapes.
    "keepalive_timeout": 45.0,
    # After an answer to a request whose body was not read (408, 413, 401 on a POST), how long to drain the rest so
    # the client sees the answer rather than a reset: enough for an honest client, short for a slow one.
    "lingering_time": 2.0,
}

# Ingest requests handled at once, per job the config allows (``ingest.max_jobs``): its progress reporter and a
# checkpoint event in flight together. Requests are counted from arrival, so steps aligned across jobs arrive in one
# event-loop turn; a limit below the jobs allowed would refuse honest reporters. Far below what would let a burst
# crowd out scrapes. More get 503 with Retry-After, which the client retries.
INGEST_REQUESTS_PER_JOB = 2
# How long one ingest request, body included, may take: a report is a few hundred bytes, so this only ever stops a
# client that sends slowly on purpose or is stuck, and then frees its slot.
INGEST_TIMEOUT_SECONDS = 10.0

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A verified password is trusted this long after its last use, so a scraper every 15 s pays bcrypt once, not every
# minute, and a flood of wrong guesses never delays it.
PASSWORD_CACHE_SECONDS = 60.0
PASSWORD_CACHE_SIZE = 256
# bcrypt runs in this many threads: off the event loop, and a flood of guesses uses two cores at most, never all.
BCRYPT_WORKERS = 2
# Password checks one client address may have running at once: more answer 429 at once, so a client with
# many connections holds one bcrypt worker at most and the other is free for everyone else.
CHECKS_PER_CLIENT = 1
CHECKS_IN_ALL = 32  # over every address: a botnet of addresses is answered 429 beyond it, not queued
# Failed password checks allowed per client address: a burst of FAILURES_BURST, then one per FAILURE_INTERVAL;
# beyond that the address gets 429 without a bcrypt check until the allowance refills.
FAILURES_BURST = 10
FAILURE_INTERVAL = 6.0
FAILURE_CLIENTS = 4096  # addresses whose failures are remembered; the oldest is forgotten first

BASIC_CHALLENGE = 'Basic realm="mfu-exporter", charset="UTF-8"'
BEARER_CHALLENGE = 'Bearer realm="mfu-exporter ingest"'

# Liveness and readiness answer "ok" or "not ready" and reveal nothing: kubelet and Docker HEALTHCHECK probes
# carry no credentials, so basic auth does not cover them (TLS still does: probe with scheme HTTPS).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


class TokenBucket:
    """The exporter-toolkit's ``rate_limit``: ``burst`` requests at once, then one per ``interval``."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float]):
        self.interval, self.burst, self._clock = interval, burst, clock
        self._tokens = float(burst)
        self._updated = clock()

    def tokens(self, now: float) -> float:
        """What is left now, refilled for the time since the last use."""
        self._tokens = min(self.burst, self._tokens + (now - self._updated) / self.interval)
        self._updated = now
        return self._tokens

    def allow(self) -> bool:
        if self.tokens(self._clock()) >= 1:
            self._tokens -= 1
            return True
        return False


@functools.lru_cache(maxsize=1024)  # asked at every report; a node's reporters come from a few addresses
def is_loopback(peer: str | None) -> bool:
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def _basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, separator, password = decoded.partition(":")
    return (user, password.encode()) if separator else None


def _bearer_token(header: str | None) -> str | None:
    scheme, _, token = (header or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class WebSecurity:
    """The web config, ingest auth and ingest limits of one server: a middleware, a response hook, a TLS context."""

    def __init__(
        self,
        web_config_file: str | None = None,
        token_file: str | None = None,
        max_concurrent_ingest: int = 64,  # from_config: ingest.max_jobs × INGEST_REQUESTS_PER_JOB
        ingest_timeout: float = INGEST_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        checkpw: Callable[[bytes, bytes], bool] = bcrypt.checkpw,
    ):
        self.max_concurrent_ingest = max_concurrent_ingest
        self.ingest_timeout = ingest_timeout
        self._clock = clock
        self._checkpw = checkpw
        self._tls_at_start: bool | None = None
        self._web = Reloading(web_config_file, self._load_web, self._web_changed, clock) if web_config_file else None
        web_config = self._web.value if self._web else NO_WEB_CONFIG
        self._tls_at_start = web_config.tls is not None
        self._tls: TlsSettings | None = web_config.tls
        self._front: ssl.SSLContext | None = None
        self._bucket = TokenBucket(*web_config.rate_limit, clock) if web_config.rate_limit else None
        self._token = Reloading(token_file, load_ingest_token) if token_file else None
        self._verified: dict[tuple[str, bytes, bytes], float] = {}
        self._bcrypt = ThreadPoolExecutor(max_workers=BCRYPT_WORKERS, thread_name_prefix="bcrypt")
        self._checks: dict[str, int] = {}  # client address -> password checks queued or running
        self._failures: dict[str, TokenBucket] = {}  # client address -> its allowance of failed checks
        self._ingest_active = 0

    @classmethod
    def from_config(cls, typed: Config) -> "WebSecurity":
        return cls(
            typed.web.config_file,
            typed.ingest.token_file,
            typed.ingest.max_jobs * INGEST_REQUESTS_PER_JOB,
            INGEST_TIMEOUT_SECONDS,
        )

    @property
    def ingest_in_flight(self) -> int:
        return self._ingest_active

    def status(self) -> dict[str, Any]:
        """The web config's state for the status document: its file, and why it is refused when it is."""
        if self._web is None:
            return {"file": None, "error": None}
        self._web.current()
        return {"file": self._web.path, "error": self._web.error}

    @property
    def tls_enabled(self) -> bool:
        return bool(self._tls_at_start)

    def _load_web(self, path: str) -> tuple[WebConfig, tuple[str, ...]]:
        config = load_web_config(path)
        if self._tls_at_start is not None and (config.tls is not None) != self._tls_at_start:
            raise ConfigError(
                path,
                "tls_server_config",
                "TLS to stay "
                + ("on" if self._tls_at_start else "off")
                + " while running: the listener is already open; restart the exporter to change it",
            )
        return config, config.watched

    def _web_changed(self, config: WebConfig) -> None:
        if config.tls is not None:
            self._tls = config.tls
            if self._front is not None:
                config.tls.apply_policy(self._front)
        if config.rate_limit is None:
            self._bucket = None
        elif self._bucket is None or (self._bucket.interval, self._bucket.burst) != config.rate_limit:
            self._bucket = TokenBucket(*config.rate_limit, self._clock)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The context to listen with, or None for plain HTTP.

        OpenSSL fixes the version bounds, client certificate mode and ciphers when a connection starts, so those
        live on this context and are updated in place on reload; the certificate chain and client CAs come from the
        newest config through the SNI callback, which runs for every handshake, with or without SNI.
        """
        if self._tls is None:
            return None
        if self._front is None:
            self._front = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.apply_policy(self._front)
            self._front.sni_callback = self._choose_certificate
        return self._front

    def _choose_certificate(self, connection: ssl.SSLObject, server_name: str | None, front: ssl.SSLContext) -> None:
        self._web.current()  # a rotated certificate is picked up here; while the files are invalid, the last good one
        connection.context = self._tls.context

    def warn_if_exposed(self, listen_address: str) -> None:
        host = listen_address.rsplit(":", 1)[0].strip("[]")
        if host == "localhost" or is_loopback(host):
            return
        if self._token is None:
            log.warning(
                "listening on %s with no ingest.token_file: progress reports are taken only from this node "
                "(loopback) and other hosts get 403; set ingest.token_file to take them over the network",
                listen_address,
            )
        elif not self.tls_enabled:
            log.warning(
                "listening on %s without TLS: the ingest bearer token crosses the network in clear text; "
                "set tls_server_config in the web config",
                listen_address,
            )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        config = self._web.current() if self._web else NO_WEB_CONFIG
        if config is None:
            # Liveness stays up: a restart would not mend the file, and it reveals nothing.
            if request.path == "/healthz":
                return await handler(request)
            return web.Response(
                status=503,
                text="the exporter's web config is invalid; see the exporter's log\n",
                headers={"Retry-After": str(int(RETRY_SECONDS))},
            )
        if self._bucket is not None and not self._bucket.allow():
            return web.Response(status=429, text="Too Many Requests\n")
        if config.tls is not None and config.tls.allowed_sans and not self._client_allowed(request, config.tls):
            return web.Response(status=403, text="the client certificate has none of the allowed SANs\n")
        if request.method not in SAFE_METHODS:
            return await self._ingest(request, handler)
        if config.users and request.path not in PROBE_PATHS:
            credentials = _basic_credentials(request.headers.get("Authorization"))
            verdict = False if credentials is None else await self._password_ok(config, *credentials, request.remote)
            if verdict is None:
                return web.Response(
                    status=429,
                    text="Too many password checks from this address; retry later\n",
                    headers={"Retry-After": str(int(FAILURE_INTERVAL))},
                )
            if not verdict:
                return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": BASIC_CHALLENGE})
        return await handler(request)

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: the web config's ``http_server_config.headers`` on every answer, errors too."""
        config = self._web.value if self._web else NO_WEB_CONFIG
        response.headers.update(config.headers)

    async def close(self, app: web.Application | None = None) -> None:
        self._bcrypt.shutdown(wait=False)

    @staticmethod
    def _client_allowed(request: web.Request, tls: TlsSettings) -> bool:
        certificate = request.transport.get_extra_info("peercert") if request.transport else None
        names = {value for _, value in (certificate or {}).get("subjectAltName", ())}
        return bool(names & tls.allowed_sans)

    async def _password_ok(self, config: WebConfig, user: str, password: bytes, client: str | None) -> bool | None:
        """Whether the password is the user's; None when the client address has spent its password checks (429).

        A cached success answers without bcrypt or any limit, and its minute starts again, so a scraper that was
        verified once is answered at once however many wrong guesses are queued beside it."""
        hashed = config.users.get(user)
        key = (user, hashed or b"", hashlib.sha256(password).digest())
        now = self._clock()
        if hashed is not None and self._verified.get(key, 0.0) > now:
            self._verified[key] = now + PASSWORD_CACHE_SECONDS
            return True
        address = client or ""
        failures = self._failures.get(address)
        if failures is not None and failures.tokens(now) < 1:
            return None
        queued = self._checks.get(address, 0)
        if queued >= CHECKS_PER_CLIENT or sum(self._checks.values()) >= CHECKS_IN_ALL:
            return None
        self._checks[address] = queued + 1
        try:
            # bcrypt reads only 72 bytes; htpasswd and Go's bcrypt truncate the same way, so their hashes keep working.
            target = hashed if hashed is not None else config.dummy_hash
            loop = asyncio.get_running_loop()
            matches = await loop.run_in_executor(self._bcrypt, self._checkpw, password[:72], target)
        finally:
            self._checks[address] -= 1
            if not self._checks[address]:
                del self._checks[address]
        now = self._clock()
        if not (matches and hashed is not None):
            self._failed(address, now)
            return False
        self._verified = {k: expiry for k, expiry in self._verified.items() if expiry > now}
        if len(self._verified) >= PASSWORD_CACHE_SIZE:
            del self._verified[next(iter(self._verified))]
        self._verified[key] = now + PASSWORD_CACHE_SECONDS
        return True

    def _failed(self, address: str, now: float) -> None:
        """One failed check of ``address``, taken from its allowance."""
        bucket = self._failures.pop(address, None)  # re-inserted last: the dict's order is the age of last use
        if bucket is None:
            bucket = TokenBucket(FAILURE_INTERVAL, FAILURES_BURST, self._clock)
            while len(self._failures) >= FAILURE_CLIENTS:
                del self._failures[next(iter(self._failures))]
        bucket.allow()
        self._failures[address] = bucket

    async def _ingest(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        refusal = self._ingest_refusal(request)
        if refusal is not None:
            return refusal
        if self._ingest_active >= self.max_concurrent_ingest:
            return _json_error(
                503,
                f"more than {self.max_concurrent_ingest} ingest requests at once; retry shortly",
                {"Retry-After": "1"},
            )
        self._ingest_active += 1
        try:
            # Bounds the whole request, body upload included, so a slow client holds a slot for a bounded time.
            if _timeout is None:  # Python 3.10
                return await asyncio.wait_for(handler(request), self.ingest_timeout)
            # In the request's own task: wait_for would start a task per report, a good part of a report's cost.
            async with _timeout(self.ingest_timeout):
                return await handler(request)
        except asyncio.TimeoutError:
            response = _json_error(408, f"the request did not arrive within {self.ingest_timeout:g} s")
            response.force_close()
            return response
        finally:
            self._ingest_active -= 1

    def _ingest_refusal(self, request: web.Request) -> web.Response | None:
        if self._token is None:
            if is_loopback(request.remote):
                return None
            return _json_error(
                403,
                f"ingest from {request.remote} refused: with no ingest.token_file set, only clients "
                "on this node (loopback) may report; set ingest.token_file and send "
                "'Authorization: Bearer <token>'",
            )
        token = self._token.current()
        if token is None:
            return _json_error(503, "the ingest token file is unreadable or invalid; see the exporter's log")
        presented = _bearer_token(request.headers.get("Authorization"))
        if presented is None:
            return _json_error(
                401,
                "ingest requires 'Authorization: Bearer <token>' (the token in ingest.token_file)",
                {"WWW-Authenticate": BEARER_CHALLENGE},
            )
        # Digests first, so the comparison takes the same time whatever the length of the guess.
        if not hmac.compare_digest(_digest(presented), _digest(token)):
            return _json_error(
                401, "the bearer token is not the one in ingest.token_file", {"WWW-Authenticate": BEARER_CHALLENGE}
            )
        return None


WEB_SECURITY = web.AppKey("web_security", WebSecurity)
