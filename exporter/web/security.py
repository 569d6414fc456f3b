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
import os
import re
import ssl
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import bcrypt
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter.config import (
    ConfigError,
    Invalid,
    Section,
    boolean,
    choice,
    duration,
    optional,
    positive_int,
    read_yaml,
    string,
    typed_config,
    validate_section,
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


PROTOCOL_LOG = logging.getLogger("exporter.web.protocol")
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
PASSWORD_CACHE_SECONDS = 60.0
PASSWORD_CACHE_SIZE = 256

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's (IANA's) names of the TLS 1.2 suites Go calls secure, with their code points; as in Go, TLS 1.3 suites are
# not configurable. OpenSSL names them differently, so the code point is the link.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": 0xC009,
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": 0xC00A,
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": 0xC013,
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": 0xC014,
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": 0xC02B,
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": 0xC02C,
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": 0xC02F,
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": 0xC030,
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA8,
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA9,
}
# The headers the exporter-toolkit lets a web config set, with the values it allows (None: any value).
CONFIGURABLE_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
}
BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}$")
HASH_FORM = "a bcrypt hash like $2y$10$... (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
TOKEN_FORM = re.compile(r"^[\x21-\x7e]+$")
BASIC_CHALLENGE = 'Basic realm="mfu-exporter", charset="UTF-8"'
BEARER_CHALLENGE = 'Bearer realm="mfu-exporter ingest"'

# Liveness and readiness answer "ok" or "not ready" and reveal nothing: kubelet and Docker HEALTHCHECK probes
# carry no credentials, so basic auth does not cover them (TLS still does: probe with scheme HTTPS).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


def _client_auth_type(value: Any) -> str:
    if value in ("RequestClientCert", "RequireAnyClientCert"):
        raise Invalid(
            "VerifyClientCertIfGiven or RequireAndVerifyClientCert (Python's TLS verifies every client "
            "certificate it asks for, so RequestClientCert and RequireAnyClientCert cannot be honoured)"
        )
    return choice(*CLIENT_AUTH_TYPES)(value)


def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise Invalid("a list of strings")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise Invalid("a non-empty string", f"[{index}]", item)
    return value


def _cipher_suites(value: Any) -> list[str]:
    for index, name in enumerate(_string_list(value)):
        if name not in CIPHER_SUITES:
            raise Invalid("one of " + ", ".join(CIPHER_SUITES), f"[{index}]", name)
    return value


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise Invalid("a mapping of header names to values")
    for name, text in value.items():
        if name not in CONFIGURABLE_HEADERS:
            raise Invalid("a header the exporter-toolkit allows: " + ", ".join(CONFIGURABLE_HEADERS), f".{name}", name)
        if not isinstance(text, str) or not text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            raise Invalid("a non-empty header value without control characters", f".{name}", text)
        allowed = CONFIGURABLE_HEADERS[name]
        if allowed is not None and text.lower() not in allowed:
            raise Invalid("one of " + ", ".join(allowed), f".{name}", text)
    return value


def _user_names(value: Any) -> dict[Any, Any]:
    """The mapping of ``basic_auth_users``; the hashes are checked by ``_bcrypt_hashes``, which never echoes them."""
    if not isinstance(value, dict):
        raise Invalid("a mapping of user names to bcrypt hashes")
    for user in value:
        if not isinstance(user, str) or not user or ":" in user:
            raise Invalid("a user name: a non-empty string without ':'", f".{user}", user)
    return value


def _bcrypt_hashes(file: str, users: dict[str, Any]) -> dict[str, bytes]:
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed) or not 4 <= int(hashed[4:6]) <= 31:
            # Not repeated in the message: a value that is not a hash may well be a password pasted by mistake.
            raise ConfigError(file, f"basic_auth_users.{user}", HASH_FORM)
    return {user: hashed.encode() for user, hashed in users.items()}


def _not_supported(why: str) -> Callable[[Any], Any]:
    def reject(value: Any) -> Any:
        raise Invalid(f"no such key here: {why}")

    return reject


TLS_SECTION = Section(
    {
        "cert_file": (optional(string), None),
        "key_file": (optional(string), None),
        "cert": (optional(string), None),
        "key": (optional(string), None),
        "client_ca_file": (optional(string), None),
        "client_ca": (optional(string), None),
        "client_auth_type": (_client_auth_type, "NoClientCert"),
        "client_allowed_sans": (optional(_string_list), None),
        "min_version": (choice(*TLS_VERSIONS), "TLS12"),
        "max_version": (choice(*TLS_VERSIONS), "TLS13"),
        "cipher_suites": (optional(_cipher_suites), None),
        "prefer_server_cipher_suites": (boolean, True),
        "curve_preferences": (
            optional(_not_supported("OpenSSL's default key exchange groups are used; remove it")),
            None,
        ),
    }
)

WEB_CONFIG_SCHEMA = Section(
    {
        "tls_server_config": (TLS_SECTION, None),
        "http_server_config": (
            Section(
                {
                    "http2": (boolean, True),  # accepted for compatibility; this server speaks HTTP/1.1 only
                    "headers": (optional(_headers), None),
                }
            ),
            None,
        ),
        "basic_auth_users": (optional(_user_names), None),
        "rate_limit": (
            Section(
                {
                    "interval": (optional(duration), None),
                    "burst": (optional(positive_int), None),
                }
            ),
            None,
        ),
    }
)


@dataclass(frozen=True)
class TlsSettings:
    """A loaded ``tls_server_config``: ``context`` holds the certificate chain and the client CAs."""

    context: ssl.SSLContext
    minimum_version: ssl.TLSVersion
    maximum_version: ssl.TLSVersion
    verify_mode: ssl.VerifyMode
    ciphers: str | None
    prefer_server_ciphers: bool
    allowed_sans: frozenset[str]

    def apply_policy(self, context: ssl.SSLContext) -> None:
        """What OpenSSL fixes when a connection starts, before the SNI callback can swap the certificate in."""
        context.minimum_version = self.minimum_version
        context.maximum_version = self.maximum_version
        context.verify_mode = self.verify_mode
        context.set_ciphers(self.ciphers or _DEFAULT_CIPHERS)
        if self.prefer_server_ciphers:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


_DEFAULT_CIPHERS = ":".join(
    c["name"] for c in ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).get_ciphers() if c["protocol"] != "TLSv1.3"
)


@dataclass(frozen=True)
class WebConfig:
    tls: TlsSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    dummy_hash: bytes | None = None  # checked for unknown users, so timing does not tell who exists
    headers: dict[str, str] = field(default_factory=dict)
    rate_limit: tuple[float, int] | None = None  # (seconds per request, burst)
    watched: tuple[str, ...] = ()  # files whose change means a reload


NO_WEB_CONFIG = WebConfig()


@functools.lru_cache(maxsize=None)
def dummy_hash(cost: int) -> bytes:
    return bcrypt.hashpw(b"mfu-exporter: no such user", bcrypt.gensalt(rounds=cost))


def load_web_config(path: str) -> WebConfig:
    """Read and validate an exporter-toolkit web config; ``ConfigError`` names the file and the key."""
    raw = read_yaml(path)
    checked = validate_section(WEB_CONFIG_SCHEMA, raw, path)
    base = os.path.dirname(os.path.abspath(path))
    tls_given = bool(isinstance(raw, dict) and raw.get("tls_server_config"))
    tls, tls_files = _load_tls(path, base, checked["tls_server_config"]) if tls_given else (None, [])
    users = _bcrypt_hashes(path, checked["basic_auth_users"] or {})
    limit = checked["rate_limit"]
    if (limit["interval"] is None) != (limit["burst"] is None):
        missing = "interval" if limit["interval"] is None else "burst"
        raise ConfigError(path, f"rate_limit.{missing}", "a value: rate_limit needs both interval and burst")
    return WebConfig(
        tls=tls,
        users=users,
        dummy_hash=dummy_hash(max(int(h[4:6]) for h in users.values())) if users else None,
        headers=dict(checked["http_server_config"]["headers"] or {}),
        rate_limit=(limit["interval"], limit["burst"]) if limit["interval"] is not None else None,
        watched=(path, *tls_files),
    )


def _load_tls(file: str, base: str, tls: dict) -> tuple[TlsSettings, list[str]]:
    key = "tls_server_config."
    for file_key, inline_key in (("cert_file", "cert"), ("key_file", "key")):
        if (tls[file_key] is None) == (tls[inline_key] is None):
            raise ConfigError(file, key + file_key, f"exactly one of {file_key} or {inline_key} (inline PEM)")
    if tls["client_ca_file"] is not None and tls["client_ca"] is not None:
        raise ConfigError(file, key + "client_ca_file", "client_ca_file or client_ca, not both")
    auth = tls["client_auth_type"]
    has_client_ca = tls["client_ca_file"] is not None or tls["client_ca"] is not None
    if has_client_ca and auth == "NoClientCert":
        raise ConfigError(
            file,
            key + "client_auth_type",
            "VerifyClientCertIfGiven or RequireAndVerifyClientCert, since a client CA is set",
            auth,
        )
    if not has_client_ca and auth != "NoClientCert":
        raise ConfigError(
            file, key + "client_ca_file", f"the CA that signs client certificates (client_auth_type is {auth})"
        )
    if tls["client_allowed_sans"] and auth == "NoClientCert":
        raise ConfigError(
            file, key + "client_allowed_sans", "client certificates to check: set client_auth_type and client_ca_file"
        )
    minimum, maximum = TLS_VERSIONS[tls["min_version"]], TLS_VERSIONS[tls["max_version"]]
    if minimum > maximum:
        raise ConfigError(
            file, key + "min_version", f"a version no newer than max_version ({tls['max_version']})", tls["min_version"]
        )

    watched: list[str] = []
    cert = _read_pem(file, base, key, "cert_file", tls, "CERTIFICATE", watched)
    private_key = _read_pem(file, base, key, "key_file", tls, "PRIVATE KEY", watched)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # load_cert_chain takes only paths; inline PEM goes through a private directory that lives for this call only.
    with tempfile.TemporaryDirectory(prefix="mfu-exporter-tls-") as private:
        paths = []
        for name, text in (("cert.pem", cert), ("key.pem", private_key)):
            path = os.path.join(private, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
                handle.write(text)
            paths.append(path)
        try:
            context.load_cert_chain(*paths)
        except ssl.SSLError as exc:
            raise ConfigError(
                file,
                key + ("key_file" if tls["key_file"] else "key"),
                f"the private key of the certificate ({exc.reason or exc})",
            ) from None
    if has_client_ca:
        client_ca = _read_pem(file, base, key, "client_ca_file", tls, "CERTIFICATE", watched)
        try:
            context.load_verify_locations(cadata=client_ca)
        except ssl.SSLError as exc:
            raise ConfigError(file, key + "client_ca_file", f"PEM CA certificates ({exc.reason or exc})") from None
    ciphers = None
    if tls["cipher_suites"]:
        ciphers = _openssl_cipher_names(file, key + "cipher_suites", tls["cipher_suites"])
    settings = TlsSettings(
        context,
        minimum,
        maximum,
        CLIENT_AUTH_TYPES[auth],
        ciphers,
        tls["prefer_server_cipher_suites"],
        frozenset(tls["client_allowed_sans"] or ()),
    )
    settings.apply_policy(context)
    return settings, watched


def _read_pem(file: str, base: str, key: str, file_key: str, tls: dict, marker: str, watched: list[str]) -> str:
    """The PEM text of ``file_key`` or of its inline twin; a file path is relative to the web config, as in Go."""
    inline_key = file_key.removesuffix("_file")
    if tls[file_key] is None:
        text, where = tls[inline_key], key + inline_key
    else:
        path = os.path.join(base, tls[file_key])
        where = key + file_key
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise ConfigError(file, where, f"a readable PEM file ({exc.strerror})", tls[file_key]) from None
        except UnicodeDecodeError:
            raise ConfigError(file, where, "a PEM (text) file", tls[file_key]) from None
        watched.append(path)
    if f"-----BEGIN {marker}-----" not in text and not (
        marker == "PRIVATE KEY" and re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", text)
    ):
        raise ConfigError(file, where, f"PEM text with a '-----BEGIN {marker}-----' block")
    return text


def _openssl_cipher_names(file: str, where: str, names: list[str]) -> str:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.set_ciphers("ALL")
    by_code = {c["id"] & 0xFFFF: c["name"] for c in probe.get_ciphers()}
    missing = [name for name in names if CIPHER_SUITES[name] not in by_code]
    if missing:
        raise ConfigError(file, where, "cipher suites this OpenSSL offers", missing)
    return ":".join(by_code[CIPHER_SUITES[name]] for name in names)


def load_ingest_token(path: str) -> tuple[str, tuple[str, ...]]:
    where = "ingest.token_file"
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(path, where, f"a readable file holding the ingest token ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(path, where, "a text file holding the ingest token") from None
    if not TOKEN_FORM.match(token):
        raise ConfigError(path, where, "a file holding one token of printable ASCII characters without spaces")
    if mode & stat.S_IROTH:
        log.warning("%s: the ingest token file is readable by every user on this node; chmod o-r it", path)
    return token, (path,)


T = TypeVar("T")


def _stamp(paths: tuple[str, ...]) -> tuple:
    stamps = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev))
    return tuple(stamps)


class Reloading(Generic[T]):
    """A value loaded from files and loaded again when any of them changes.

    Checked with ``stat`` on each use (a few microseconds next to serving a request), so rotation needs neither a
    restart nor a signal. While the files are invalid, ``current()`` is None and ``error`` says why: callers fail
    closed, because keeping the last good value would keep a removed user signed in.
    """

    def __init__(
        self,
        path: str,
        load: Callable[[str], tuple[T, tuple[str, ...]]],
        on_change: Callable[[T], None] = lambda value: None,
    ):
        self.path = path
        self._load = load
        self._on_change = on_change
        self.value, self._watched = load(path)
        self._stamp = _stamp(self._watched)
        self.error: str | None = None

    def current(self) -> T | None:
        stamp = _stamp(self._watched)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                value, watched = self._load(self.path)
            except ConfigError as exc:
                self.error = str(exc)
                log.error("%s; failing closed until it is fixed", exc)
            else:
                self.value, self.error = value, None
                self._watched, self._stamp = watched, _stamp(watched)
                self._on_change(value)
                log.info("reloaded %s", self.path)
        return None if self.error else self.value


class TokenBucket:
    """The exporter-toolkit's ``rate_limit``: ``burst`` requests at once, then one per ``interval``."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float]):
        self.interval, self.burst, self._clock = interval, burst, clock
        self._tokens = float(burst)
        self._updated = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) / self.interval)
        self._updated = now
        if self._tokens >= 1:
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
        self._web = Reloading(web_config_file, self._load_web, self._web_changed) if web_config_file else None
        web_config = self._web.value if self._web else NO_WEB_CONFIG
        self._tls_at_start = web_config.tls is not None
        self._tls: TlsSettings | None = web_config.tls
        self._front: ssl.SSLContext | None = None
        self._bucket = TokenBucket(*web_config.rate_limit, clock) if web_config.rate_limit else None
        self._token = Reloading(token_file, load_ingest_token) if token_file else None
        self._verified: dict[tuple[str, bytes, bytes], float] = {}
        # One thread: bcrypt runs off the event loop, and a flood of guesses uses one core, never all of them.
        self._bcrypt = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")
        self._ingest_active = 0

    @classmethod
    def from_config(cls, config: dict) -> "WebSecurity":
        typed = typed_config(config)
        return cls(
            typed.web.config_file,
            typed.ingest.token_file,
            typed.ingest.max_jobs * INGEST_REQUESTS_PER_JOB,
            INGEST_TIMEOUT_SECONDS,
        )

    @property
    def ingest_in_flight(self) -> int:
        return self._ingest_active

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
            return web.Response(status=500, text="the exporter's web config is invalid; see the exporter's log\n")
        if self._bucket is not None and not self._bucket.allow():
            return web.Response(status=429, text="Too Many Requests\n")
        if config.tls is not None and config.tls.allowed_sans and not self._client_allowed(request, config.tls):
            return web.Response(status=403, text="the client certificate has none of the allowed SANs\n")
        if request.method not in SAFE_METHODS:
            return await self._ingest(request, handler)
        if config.users and request.path not in PROBE_PATHS:
            credentials = _basic_credentials(request.headers.get("Authorization"))
            if credentials is None or not await self._password_ok(config, *credentials):
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

    async def _password_ok(self, config: WebConfig, user: str, password: bytes) -> bool:
        hashed = config.users.get(user)
        key = (user, hashed or b"", hashlib.sha256(password).digest())
        now = self._clock()
        if hashed is not None and self._verified.get(key, 0.0) > now:
            return True
        # bcrypt reads only 72 bytes; htpasswd and Go's bcrypt truncate the same way, so their hashes keep working.
        target = hashed if hashed is not None else config.dummy_hash
        loop = asyncio.get_running_loop()
        matches = await loop.run_in_executor(self._bcrypt, self._checkpw, password[:72], target)
        if not (matches and hashed is not None):
            return False
        self._verified = {k: expiry for k, expiry in self._verified.items() if expiry > now}
        if len(self._verified) >= PASSWORD_CACHE_SIZE:
            del self._verified[next(iter(self._verified))]
        self._verified[key] = now + PASSWORD_CACHE_SECONDS
        return True

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
