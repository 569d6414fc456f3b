"""The exporter-toolkit web config (``--web.config.file``) and the ingest token file: their schema, TLS settings,
PEM files, and reloading when a file changes (``Reloading``, checked by ``stat``). What the server does with them
per request is ``mfu_exporter.web.security``."""

from __future__ import annotations

import functools
import logging
import os
import re
import ssl
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import bcrypt

from mfu_exporter.config import (
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
    validate_section,
)

log = logging.getLogger(__name__)

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
BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}\Z")
HASH_FORM = "a bcrypt hash like $2y$10$... (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
TOKEN_FORM = re.compile(r"^[\x21-\x7e]+\Z")


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
    try:
        _load_cert_chain(context, cert, private_key)
    except ssl.SSLError as exc:
        raise ConfigError(
            file,
            key + ("key_file" if tls["key_file"] else "key"),
            f"the private key of the certificate ({exc.reason or exc})",
        ) from None
    except OSError as exc:
        raise ConfigError(
            file,
            key + ("cert_file" if tls["cert_file"] else "cert"),
            f"a certificate loaded from memory, which needs /proc mounted ({exc.strerror or exc})",
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


def _load_cert_chain(context: ssl.SSLContext, cert: str, private_key: str) -> None:
    """Load PEM text without writing it to any file system.

    ``load_cert_chain`` takes only paths, so the text goes into anonymous memory files read through /proc/self/fd.
    Nothing is written under TMPDIR: the DaemonSet's root file system is read-only, and a full temp directory must
    not stop a reload.
    """
    handles = []
    try:
        for name, text in (("cert", cert), ("key", private_key)):
            handle = os.memfd_create(f"mfu-exporter-tls-{name}", os.MFD_CLOEXEC)
            handles.append(handle)
            data = text.encode()
            while data:
                data = data[os.write(handle, data) :]
        context.load_cert_chain(*(f"/proc/self/fd/{handle}" for handle in handles))
    finally:
        for handle in handles:
            os.close(handle)


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


# How soon a load that failed is tried again with its files unchanged: a full disk or a missing mount may clear by
# itself, and one attempt every few seconds costs nothing next to the requests refused meanwhile.
RETRY_SECONDS = 5.0


class Reloading(Generic[T]):
    """A value loaded from files and loaded again when any of them changes.

    Checked with ``stat`` on each use (a few microseconds next to serving a request), so rotation needs neither a
    restart nor a signal. While the files are invalid, ``current()`` is None and ``error`` says why: callers fail
    closed, because keeping the last good value would keep a removed user signed in. Any exception of a reload
    counts as invalid, not only ``ConfigError``: an I/O error halfway through must not leave the old value in force.
    A failed load is tried again when the files change or ``RETRY_SECONDS`` later.
    """

    def __init__(
        self,
        path: str,
        load: Callable[[str], tuple[T, tuple[str, ...]]],
        on_change: Callable[[T], None] = lambda value: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path = path
        self._load = load
        self._on_change = on_change
        self._clock = clock
        self.value, self._watched = load(path)
        self._stamp = _stamp(self._watched)
        self.error: str | None = None
        self.failed_at: float | None = None

    def current(self) -> T | None:
        stamp = _stamp(self._watched)
        retry = self.failed_at is not None and self._clock() - self.failed_at >= RETRY_SECONDS
        if stamp != self._stamp or retry:
            self._stamp = stamp
            try:
                value, watched = self._load(self.path)
            except Exception as exc:  # noqa: BLE001 - whatever broke the load, the old value must not stay in force
                error = str(exc) if isinstance(exc, ConfigError) else f"{self.path}: {type(exc).__name__}: {exc}"
                if error != self.error:
                    log.error("%s; refusing requests until it loads", error)
                self.error, self.failed_at = error, self._clock()
            else:
                self.value, self.error, self.failed_at = value, None, None
                self._watched, self._stamp = watched, _stamp(watched)
                self._on_change(value)
                log.info("reloaded %s", self.path)
        return None if self.error else self.value
