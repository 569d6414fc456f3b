import asyncio
import base64
import contextlib
import logging
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from unittest import mock

import aiohttp
import bcrypt
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from mfu_exporter import VERSION_HEADER, __version__
from mfu_exporter.config import ConfigError, typed_config, validate
from mfu_exporter.service import build_service
from mfu_exporter.web import security as websecurity
from mfu_exporter.web.app import create_app, serve
from mfu_exporter.web.security import WebSecurity, is_loopback
from mfu_exporter.web.webconfig import load_web_config
from tests.support.net import free_port
from tests.support.wait import wait_for

PASSWORD = b"correct horse"
# Cost 4 keeps the tests fast; "$2y$" is the prefix htpasswd -B writes, the same algorithm as "$2b$".
ALICE_HASH = "$2y$" + bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=4)).decode()[4:]
REPORT = {"job": "llama", "tokens_total": 1000}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class CheckpwSpy:
    def __init__(self):
        self.hashes = []

    def __call__(self, password, hashed):
        self.hashes.append(hashed)
        return bcrypt.checkpw(password, hashed)


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def write(path, text):
    """Write ``text`` and move the mtime on, so a reload never depends on the file system's timestamp granularity."""
    path.write_text(text)
    stamp = getattr(write, "stamp", 1_700_000_000)
    write.stamp = stamp + 10
    os.utime(path, (stamp, stamp))
    return str(path)


@pytest.fixture
def secured(aiohttp_client):
    """An aiohttp test client around the real app with an injected WebSecurity."""

    async def make(security, config=None):
        service = build_service(validate(config or {}), [])
        client = await aiohttp_client(create_app(service, security))
        client.service = service
        return client

    return make


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two server CAs (for rotation) and a client CA with an allowed and a not-allowed client certificate."""
    root = tmp_path_factory.mktemp("pki")
    ca, other_ca, client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    for name, authority in (("a", ca), ("b", other_ca)):
        cert = authority.issue_cert("127.0.0.1", "localhost")
        cert.cert_chain_pems[0].write_to_path(root / f"server-{name}.crt")
        cert.private_key_pem.write_to_path(root / f"server-{name}.key")
    client_ca.cert_pem.write_to_path(root / "client-ca.crt")
    return {
        "ca": ca,
        "other_ca": other_ca,
        "client_ca": client_ca,
        "dir": root,
        "scraper": client_ca.issue_cert("scraper.example"),
        "intruder": client_ca.issue_cert("intruder.example"),
        "stranger": trustme.CA().issue_cert("scraper.example"),
    }


def client_context(trust, cert=None, maximum=None):
    context = ssl.create_default_context()
    trust.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    if maximum is not None:
        context.maximum_version = maximum
    return context


async def fetch(port, context, path="/metrics"):
    """(status, body) over a new TLS connection, so every call is a full handshake."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with session.get(f"https://127.0.0.1:{port}{path}", ssl=context) as response:
            return response.status, await response.text()


@contextlib.asynccontextmanager
async def serving(web_config_file=None, token_file=None):
    """The real ``serve()`` (TLS context, HTTP limits) on a free loopback port."""
    port = free_port()
    config = validate(
        {
            "web": {"listen_address": f"127.0.0.1:{port}", "config_file": web_config_file},
            "ingest": {"token_file": token_file},
        }
    )
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(build_service(config, []), on_started=lambda urls: started.set(), stop=stop))
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    try:
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


# --- the web config file: loading and its errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,key",
    [
        ("unknown: 1\n", "unknown"),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, min_version: TLS9}\n",
            "tls_server_config.min_version",
        ),
        ("tls_server_config: {cert_file: server-a.crt}\n", "tls_server_config.key_file"),
        ("tls_server_config: {min_version: TLS13}\n", "tls_server_config.cert_file"),
        ("tls_server_config: {cert_file: missing.crt, key_file: server-a.key}\n", "tls_server_config.cert_file"),
        ("tls_server_config: {cert_file: server-a.crt, key_file: server-b.key}\n", "tls_server_config.key_file"),
        ("tls_server_config: {cert_file: server-a.crt, key_file: server-a.crt}\n", "tls_server_config.key_file"),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, client_ca_file: client-ca.crt}\n",
            "tls_server_config.client_auth_type",
        ),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, client_auth_type: RequireAndVerifyClientCert}\n",
            "tls_server_config.client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, client_ca_file: client-ca.crt, "
            "client_auth_type: RequestClientCert}\n",
            "tls_server_config.client_auth_type",
        ),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, min_version: TLS13, max_version: TLS12}\n",
            "tls_server_config.min_version",
        ),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}\n",
            "tls_server_config.cipher_suites[0]",
        ),
        (
            "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, curve_preferences: [X25519]}\n",
            "tls_server_config.curve_preferences",
        ),
        ("http_server_config: {headers: {Server: nginx}}\n", "http_server_config.headers.Server"),
        ("http_server_config: {headers: {X-Frame-Options: allowall}}\n", "http_server_config.headers.X-Frame-Options"),
        ("basic_auth_users: {alice: hunter2}\n", "basic_auth_users.alice"),
        ("basic_auth_users: {'al:ice': '$2y$04$abc'}\n", "basic_auth_users.al:ice"),
        ("rate_limit: {burst: 5}\n", "rate_limit.interval"),
        ("basic_auth_users: [alice\n", ""),
    ],
)
def test_a_bad_web_config_names_the_file_and_the_key(pki, text, key):
    path = write(pki["dir"] / "bad-web.yml", text)
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: " if key else f"{path}: ")
    assert "expected" in message
    assert "hunter2" not in message  # a password pasted where a hash belongs is not echoed into logs


def test_a_bad_web_config_exits_2_with_one_line(pki):
    path = write(pki["dir"] / "cli-web.yml", "basic_auth_users: {alice: hunter2}\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mfu_exporter",
            "--web.config.file",
            path,
            "--web.listen-address",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"mfu-exporter: {path}: basic_auth_users.alice: expected a bcrypt hash")
    )
    assert "Traceback" not in result.stderr


def test_cipher_suites_use_go_names_and_inline_pem_works(pki):
    cert = (pki["dir"] / "server-a.crt").read_text()
    key = (pki["dir"] / "server-a.key").read_text()
    path = pki["dir"] / "inline-web.yml"
    path.write_text(
        "tls_server_config:\n  cert: |\n"
        + "".join(f"    {line}\n" for line in cert.splitlines())
        + "  key: |\n"
        + "".join(f"    {line}\n" for line in key.splitlines())
        + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]\n"
    )
    config = load_web_config(str(path))
    tls12 = [c["name"] for c in config.tls.context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"]
    assert config.watched == (str(path),)  # inline PEM: only the config file itself to watch


# --- basic auth, headers, rate limit --------------------------------------------------------------------------------


async def test_basic_auth_guards_reads_with_a_challenge_and_y_hashes_work(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    client = await secured(WebSecurity(web_config))
    for auth in ({}, basic("alice", "wrong"), basic("mallory", PASSWORD.decode())):
        response = await client.get("/metrics", headers=auth)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Basic ")
    response = await client.get("/metrics", headers={"Authorization": "Basic !!not-base64"})
    assert response.status == 401
    response = await client.get("/metrics", headers=basic("alice", PASSWORD.decode()))
    assert response.status == 200
    assert "mfu_exporter_build_info" in await response.text()
    for probe in ("/healthz", "/readyz", "/"):
        response = await client.get(probe)
        assert (response.status == 401) is (probe == "/"), probe  # kubelet and HEALTHCHECK probes carry no credentials


async def test_unknown_users_cost_a_bcrypt_check_and_verified_passwords_are_cached_briefly(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    clock, spy = FakeClock(), CheckpwSpy()
    client = await secured(WebSecurity(web_config, clock=clock, checkpw=spy))
    assert (await client.get("/metrics", headers=basic("mallory", "guess"))).status == 401
    [dummy] = spy.hashes
    assert dummy != ALICE_HASH.encode() and dummy[4:6] == b"04"  # a dummy hash with the users' cost
    alice = basic("alice", PASSWORD.decode())
    for _ in range(3):
        assert (await client.get("/metrics", headers=alice)).status == 200
    assert len(spy.hashes) == 2  # one bcrypt check for three scrapes
    assert (await client.get("/metrics", headers=basic("alice", "wrong"))).status == 401
    assert len(spy.hashes) == 3  # failures are never cached
    clock.now += websecurity.PASSWORD_CACHE_SECONDS + 1
    assert (await client.get("/metrics", headers=alice)).status == 200
    assert len(spy.hashes) == 4


async def test_ingest_is_governed_by_its_own_auth_not_by_basic_auth(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    client = await secured(WebSecurity(web_config))
    assert (await client.post("/api/v1/progress", json=REPORT)).status == 200  # loopback, no token configured
    assert (await client.get("/api/v1/jobs")).status == 401


async def test_configured_headers_are_on_every_answer(secured, tmp_path):
    web_config = write(
        tmp_path / "web.yml",
        f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\nhttp_server_config:\n"
        "  headers: {X-Frame-Options: deny, Content-Security-Policy: \"default-src 'self'\"}\n",
    )
    client = await secured(WebSecurity(web_config))
    alice = basic("alice", PASSWORD.decode())
    for response in (
        await client.get("/metrics"),
        await client.get("/metrics", headers=alice),
        await client.get("/no-such-page", headers=alice),
        await client.post("/api/v1/progress", data=b"{"),
    ):
        assert response.headers["X-Frame-Options"] == "deny"
        assert response.headers["Content-Security-Policy"] == "default-src 'self'"


async def test_rate_limit_answers_429_beyond_the_burst(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", "rate_limit: {interval: 1m, burst: 2}\n")
    clock = FakeClock()
    client = await secured(WebSecurity(web_config, clock=clock))
    assert [(await client.get("/healthz")).status for _ in range(3)] == [200, 200, 429]
    clock.now += 60
    assert (await client.get("/healthz")).status == 200


async def test_web_config_changes_apply_without_restart_and_a_broken_file_fails_closed(secured, tmp_path, caplog):
    path = tmp_path / "web.yml"
    write(path, f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    client = await secured(WebSecurity(str(path)))
    alice, bob = basic("alice", PASSWORD.decode()), basic("bob", PASSWORD.decode())
    assert (await client.get("/metrics", headers=alice)).status == 200
    write(path, f"basic_auth_users: {{bob: '{ALICE_HASH}'}}\n")
    assert (
        await client.get("/metrics", headers=alice)
    ).status == 401  # removed: the cached success does not outlive it
    assert (await client.get("/metrics", headers=bob)).status == 200
    write(path, "basic_auth_users: {bob: 'not a hash'}\n")
    with caplog.at_level(logging.ERROR, logger="mfu_exporter.web.security"):
        broken = await client.get("/metrics", headers=bob)
    assert broken.status == 503
    assert "web config is invalid" in await broken.text()
    assert "basic_auth_users.bob" in caplog.text
    assert (await client.post("/api/v1/progress", json=REPORT)).status == 503
    assert client.service.jobs.names() == []
    write(path, f"basic_auth_users: {{bob: '{ALICE_HASH}'}}\n")
    assert (await client.get("/metrics", headers=bob)).status == 200


# --- ingest auth ----------------------------------------------------------------------------------------------------


async def test_ingest_needs_the_bearer_token_when_a_token_file_is_set(secured, tmp_path):
    token_file = write(tmp_path / "token", "s3cr3t-token\n")
    client = await secured(WebSecurity(token_file=token_file))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcjN0LXRva2Vu"}):
        response = await client.post("/api/v1/progress", json=REPORT, headers=headers)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "ingest.token_file" in (await response.json())["error"]
        assert VERSION_HEADER not in response.headers  # the version is for callers past the token only
    assert client.service.jobs.names() == []
    response = await client.post("/api/v1/progress", json=REPORT, headers={"Authorization": "Bearer s3cr3t-token"})
    assert response.status == 200
    assert response.headers[VERSION_HEADER] == __version__
    assert (await client.get("/api/v1/jobs")).status == 200  # reads follow the web config, not the ingest token
    write(tmp_path / "token", "rotated-token\n")
    rotated = {**REPORT, "tokens_total": 2000}
    assert (
        await client.post("/api/v1/progress", json=rotated, headers={"Authorization": "Bearer s3cr3t-token"})
    ).status == 401
    assert (
        await client.post("/api/v1/progress", json=rotated, headers={"Authorization": "Bearer rotated-token"})
    ).status == 200


@pytest.mark.parametrize("content,problem", [(None, "No such file"), ("", "one token"), ("two words", "one token")])
def test_a_bad_token_file_is_a_config_error(tmp_path, content, problem):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        WebSecurity(token_file=str(path))
    assert str(caught.value).startswith(f"{path}: ingest.token_file: expected")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    "peer,loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.1.2.3", False),
        ("::ffff:10.1.2.3", False),
        ("fe80::1%eth0", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_peers(peer, loopback):
    assert is_loopback(peer) is loopback


async def test_without_a_token_ingest_from_other_hosts_gets_403_and_reads_still_work():
    security = WebSecurity()
    handled = []

    async def handler(request):
        handled.append(request.method)
        return web.Response(text="ok")

    def from_peer(method, peer):
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (
            (peer, 40000) if name == "peername" else default
        )
        return make_mocked_request(method, "/api/v1/progress", transport=transport)

    refused = await security.middleware(from_peer("POST", "10.1.2.3"), handler)
    assert refused.status == 403
    assert "10.1.2.3" in refused.text and "ingest.token_file" in refused.text
    assert handled == []
    assert (await security.middleware(from_peer("POST", "127.0.0.1"), handler)).status == 200
    assert (await security.middleware(from_peer("GET", "10.1.2.3"), handler)).status == 200
    await security.close()


def test_a_network_listener_without_a_token_logs_a_warning(tmp_path, caplog):
    token_file = write(tmp_path / "token", "t0ken\n")
    os.chmod(token_file, 0o600)
    with caplog.at_level(logging.WARNING, logger="mfu_exporter.web.security"):
        for address in ("127.0.0.1:9495", "[::1]:9495", "localhost:9495"):
            WebSecurity().warn_if_exposed(address)
        assert caplog.records == []
        WebSecurity().warn_if_exposed(":9495")
        assert "ingest.token_file" in caplog.records[-1].getMessage()
        WebSecurity(token_file=token_file).warn_if_exposed("0.0.0.0:9495")
        assert "clear text" in caplog.records[-1].getMessage()
    assert len(caplog.records) == 2


# --- limits ---------------------------------------------------------------------------------------------------------


def partial_post(port, body_sent, content_length):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /api/v1/progress HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % content_length + body_sent
    )
    return sock


def read_response(sock):
    """One HTTP response, read by its Content-Length without waiting for the connection to close."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def read_all(sock):
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


async def test_concurrent_ingest_beyond_the_limit_gets_503_and_the_slot_comes_back(secured):
    security = WebSecurity(max_concurrent_ingest=1)
    client = await secured(security)
    body = b'{"job": "slow", "tokens_total": 5}'
    slow = await asyncio.to_thread(partial_post, client.server.port, body[:10], len(body))
    try:
        await wait_for(lambda: security.ingest_in_flight == 1)
        busy = await client.post("/api/v1/progress", json=REPORT)
        assert busy.status == 503
        assert busy.headers["Retry-After"] == "1"
        assert "at once" in (await busy.json())["error"]
        assert client.service.jobs.names() == []
        await asyncio.to_thread(slow.sendall, body[10:])
        await wait_for(lambda: client.service.jobs.names() == ["slow"])
        await wait_for(lambda: security.ingest_in_flight == 0)
    finally:
        slow.close()
    assert (await client.post("/api/v1/progress", json=REPORT)).status == 200


def test_the_ingest_concurrency_limit_leaves_room_for_every_job_the_config_allows():
    for max_jobs in (1, 32, 200):
        security = WebSecurity.from_config(typed_config(validate({"ingest": {"max_jobs": max_jobs}})))
        assert security.max_concurrent_ingest == max_jobs * websecurity.INGEST_REQUESTS_PER_JOB


async def test_a_slow_body_gets_408_and_frees_its_slot(secured):
    security = WebSecurity(max_concurrent_ingest=1, ingest_timeout=0.2)
    client = await secured(security)
    sock = await asyncio.to_thread(partial_post, client.server.port, b'{"job": ', 100)
    try:
        head, body = await asyncio.to_thread(read_response, sock)
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 408")
    assert b"did not arrive" in body
    assert security.ingest_in_flight == 0
    assert (await client.post("/api/v1/progress", json=REPORT)).status == 200


async def test_idle_and_slow_header_connections_are_closed_and_huge_headers_refused(monkeypatch):
    monkeypatch.setitem(websecurity.HTTP_LIMITS, "keepalive_timeout", 0.2)
    async with serving() as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            assert await asyncio.to_thread(read_all, sock) == b""  # closed without an answer
        finally:
            sock.close()
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
            answer = await asyncio.to_thread(read_all, sock)
        finally:
            sock.close()
        assert answer.split(b" ", 2)[1] == b"400"


# --- TLS: real handshakes on loopback --------------------------------------------------------------------------------


async def test_tls_serves_metrics_and_enforces_the_minimum_version(pki):
    web_config = write(
        pki["dir"] / "tls-web.yml",
        "tls_server_config: {cert_file: server-a.crt, key_file: server-a.key, min_version: TLS13}\n",
    )
    async with serving(web_config) as port:
        status, body = await fetch(port, client_context(pki["ca"]))
        assert status == 200 and "mfu_exporter_build_info" in body
        with pytest.raises(aiohttp.ClientError):
            await fetch(port, client_context(pki["ca"], maximum=ssl.TLSVersion.TLSv1_2))
        with pytest.raises(aiohttp.ClientError):
            await fetch(port, client_context(pki["other_ca"]))  # not the CA that signed the server certificate
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as session:
                await session.get(f"http://127.0.0.1:{port}/metrics")


async def test_mtls_requires_a_client_certificate_from_the_client_ca_with_an_allowed_san(pki):
    web_config = write(
        pki["dir"] / "mtls-web.yml",
        "tls_server_config:\n  cert_file: server-a.crt\n  key_file: server-a.key\n"
        "  client_ca_file: client-ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_allowed_sans: [scraper.example]\n",
    )
    async with serving(web_config) as port:
        assert (await fetch(port, client_context(pki["ca"], pki["scraper"])))[0] == 200
        for cert in (None, pki["stranger"]):  # no certificate; one from a CA the server does not trust
            with pytest.raises(aiohttp.ClientError):
                await fetch(port, client_context(pki["ca"], cert))
        status, body = await fetch(port, client_context(pki["ca"], pki["intruder"]))
        assert status == 403 and "allowed SANs" in body


async def test_a_rotated_certificate_and_policy_reach_new_connections_without_restart(pki, tmp_path):
    for name in ("crt", "key"):
        (tmp_path / f"server.{name}").write_bytes((pki["dir"] / f"server-a.{name}").read_bytes())
    web_config = write(tmp_path / "web.yml", "tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    async with serving(web_config) as port:
        tls12 = ssl.TLSVersion.TLSv1_2
        assert (await fetch(port, client_context(pki["ca"], maximum=tls12)))[0] == 200
        for name in ("crt", "key"):
            write(tmp_path / f"server.{name}", (pki["dir"] / f"server-b.{name}").read_text())
        # No request came in between: the handshake itself notices the new files.
        assert (await fetch(port, client_context(pki["other_ca"], maximum=tls12)))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await fetch(port, client_context(pki["ca"]))
        write(
            tmp_path / "web.yml",
            "tls_server_config: {cert_file: server.crt, key_file: server.key, min_version: TLS13}\n",
        )
        assert (await fetch(port, client_context(pki["other_ca"])))[0] == 200  # this request reloads the config
        with pytest.raises(aiohttp.ClientError):
            await fetch(port, client_context(pki["other_ca"], maximum=tls12))


# --- failing closed: any failed load refuses requests --------------------------------------------------------------


async def test_a_reload_that_fails_with_an_io_error_refuses_requests_until_a_good_config_loads(
    secured, tmp_path, caplog
):
    path = tmp_path / "web.yml"
    write(path, f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    clock = FakeClock()
    client = await secured(WebSecurity(str(path), clock=clock))
    alice, bob = basic("alice", PASSWORD.decode()), basic("bob", PASSWORD.decode())
    assert (await client.get("/metrics", headers=alice)).status == 200
    write(path, f"basic_auth_users: {{bob: '{ALICE_HASH}'}}\n")
    full = OSError(28, "No space left on device")
    with mock.patch.object(websecurity, "load_web_config", side_effect=full):
        with caplog.at_level(logging.ERROR, logger="mfu_exporter.web.webconfig"):
            answers = [await client.get("/metrics", headers=who) for who in (alice, alice, bob)]
        assert [a.status for a in answers] == [503, 503, 503]  # never the removed user's old access
        assert answers[0].headers["Retry-After"] == "5"
        assert (await client.get("/healthz")).status == 200  # liveness: a restart would not mend the file
        assert (await client.get("/readyz")).status == 503
        assert [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()] == [
            f"{path}: OSError: [Errno 28] No space left on device; refusing requests until it loads"
        ]  # one line, however many requests were refused
        clock.now += 5
        assert (await client.get("/metrics", headers=bob)).status == 503  # retried, failed again
    clock.now += 5  # the disk has room again: the next retry loads the file
    assert (await client.get("/metrics", headers=bob)).status == 200
    assert (await client.get("/metrics", headers=alice)).status == 401
    status = await (await client.get("/api/v1/status", headers=bob)).json()
    assert status["web_config"] == {"file": str(path), "error": None}


def test_the_status_entry_says_why_the_web_config_is_refused(tmp_path):
    path = tmp_path / "web.yml"
    write(path, f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    security = WebSecurity(str(path))
    write(path, "basic_auth_users: {alice: 'not a hash'}\n")
    status = security.status()
    assert status["file"] == str(path)
    assert "basic_auth_users.alice" in status["error"]


def test_tls_loads_with_a_read_only_temp_directory(pki, tmp_path, monkeypatch):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    monkeypatch.setenv("TMPDIR", str(read_only))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))  # nothing may be written under TMPDIR
    cert = (pki["dir"] / "server-a.crt").read_text()
    key = (pki["dir"] / "server-a.key").read_text()
    path = tmp_path / "web.yml"
    path.write_text(
        f"tls_server_config: {{cert_file: {pki['dir'] / 'server-a.crt'}, key_file: {pki['dir'] / 'server-a.key'}}}\n"
    )
    assert load_web_config(str(path)).tls is not None
    inline = tmp_path / "inline.yml"
    inline.write_text(
        "tls_server_config:\n  cert: |\n"
        + "".join(f"    {line}\n" for line in cert.splitlines())
        + "  key: |\n"
        + "".join(f"    {line}\n" for line in key.splitlines())
    )
    assert load_web_config(str(inline)).tls is not None
    assert list(read_only.iterdir()) == []


# --- auth under attack: bounded, fair password checking -----------------------------------------------------------


class GatedCheckpw:
    """bcrypt that holds every wrong password until ``release``: the flood's checks stay queued or running while
    the test asks what a valid scraper gets meanwhile."""

    def __init__(self):
        self.calls, self.held = 0, 0
        self.gate = threading.Event()

    def __call__(self, password, hashed):
        self.calls += 1
        if bcrypt.checkpw(password, hashed):
            return True
        self.held += 1
        self.gate.wait(30)
        return False


async def test_a_wrong_password_flood_gets_429_and_valid_scrapes_are_answered_meanwhile(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{ALICE_HASH}', bob: '{ALICE_HASH}'}}\n")
    clock, checkpw = FakeClock(), GatedCheckpw()
    client = await secured(WebSecurity(web_config, clock=clock, checkpw=checkpw))
    url = client.make_url("/metrics")
    alice, bob = basic("alice", PASSWORD.decode()), basic("bob", PASSWORD.decode())
    assert (await client.get("/metrics", headers=alice)).status == 200  # verified once, then cached

    attacker = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0))
    try:

        async def guess():
            async with attacker.get(url, headers=basic("alice", "wrong")) as response:
                return response.status

        flood = [asyncio.create_task(guess()) for _ in range(50)]
        await wait_for(lambda: sum(task.done() for task in flood) == 49, 30, "49 of 50 guesses answered")
        assert [task.result() for task in flood if task.done()] == [429] * 49
        # One check of that address at a time (its bcrypt may still be running): the other worker stays free.
        await wait_for(lambda: checkpw.held == 1, 30, "the flood's one check held")
        # While the flood's check is held: a cached scrape and an uncached one from another address are answered.
        assert (await client.get("/metrics", headers=alice)).status == 200
        assert (await client.get("/metrics", headers=bob)).status == 200
        checkpw.gate.set()
        assert sorted(await asyncio.gather(*flood)) == [401] + [429] * 49

        # Failed checks are limited per address: after the allowance, 429 without a bcrypt check.
        statuses = []
        for _ in range(websecurity.FAILURES_BURST):
            async with attacker.get(url, headers=basic("alice", "wrong")) as response:
                statuses.append(response.status)
        assert statuses == [401] * (websecurity.FAILURES_BURST - 1) + [429]  # the flood's failure counted too
        calls = checkpw.calls
        async with attacker.get(url, headers=basic("mallory", "wrong")) as response:
            assert response.status == 429 and response.headers["Retry-After"] == "6"
        assert checkpw.calls == calls
        assert (await client.get("/metrics", headers=basic("alice", "wrong"))).status == 401  # its own allowance
        clock.now += websecurity.FAILURE_INTERVAL  # one more failure allowed
        async with attacker.get(url, headers=basic("alice", "wrong")) as response:
            assert response.status == 401
    finally:
        checkpw.gate.set()
        await attacker.close()


async def test_the_password_cache_is_refreshed_on_each_hit(secured, tmp_path):
    web_config = write(tmp_path / "web.yml", f"basic_auth_users: {{alice: '{ALICE_HASH}'}}\n")
    clock, spy = FakeClock(), CheckpwSpy()
    client = await secured(WebSecurity(web_config, clock=clock, checkpw=spy))
    alice = basic("alice", PASSWORD.decode())
    for _ in range(4):  # a scrape every 50 s: each inside the minute since the last one
        assert (await client.get("/metrics", headers=alice)).status == 200
        clock.now += 50
    assert len(spy.hashes) == 1


def test_tls_without_proc_or_memfd_is_a_config_error_naming_the_key(pki, tmp_path, monkeypatch):
    def no_memfd(name, flags=0):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    path = tmp_path / "web.yml"
    path.write_text(
        f"tls_server_config: {{cert_file: {pki['dir'] / 'server-a.crt'}, key_file: {pki['dir'] / 'server-a.key'}}}\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_web_config(str(path))
    assert str(refused.value).startswith(
        f"{path}: tls_server_config.cert_file: expected a certificate loaded from memory"
    )
