"""``mfu-exporter healthcheck``: asks the daemon's ``/healthz`` the way the daemon serves it, for Docker's HEALTHCHECK.

A probe written into an image cannot know how the container was started: the port may come from a flag or an env
var, and TLS from a web config named by either. So the probe takes the daemon's own settings: the same flags and env
vars as ``run`` (each read as the daemon reads it), or, with ``--daemon-pid``, the daemon's command line and
``MFU_EXPORTER_*`` environment from ``/proc/<pid>``, its config and web config files read relative to its working
directory. With ``tls_server_config`` set it speaks HTTPS, otherwise HTTP, to the listen address's port.

Exit 0 when the daemon answers, 1 when it does not (Docker reserves 2), with one line saying what was asked and what
came back, which Docker keeps in the container's health log.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from mfu_exporter.cli.flags import BadEnv, add_daemon_flags, load_daemon_config
from mfu_exporter.config import ConfigError, read_yaml, typed_config

EXIT_HEALTHY, EXIT_UNHEALTHY = 0, 1
ENV_PREFIX = "MFU_EXPORTER_"
# client_auth_type values under which a client without a certificate is refused during the handshake.
CLIENT_CERT_REQUIRED = {"RequireAnyClientCert", "RequireAndVerifyClientCert"}


class Unhealthy(Exception):
    pass


@dataclass(frozen=True)
class Target:
    """Where and how to ask: what the daemon's settings say it listens on."""

    host: str
    port: int
    tls: bool
    client_cert_required: bool = False
    allowed_sans: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/healthz"


def probe_host(listen_host: str | None) -> str:
    """The address to reach a listener bound to ``listen_host``: the loopback of its family for a wildcard."""
    if listen_host in (None, "", "0.0.0.0"):
        return "127.0.0.1"
    if listen_host == "::":
        return "::1"  # asyncio binds "::" with IPV6_V6ONLY, so 127.0.0.1 would not reach it
    return listen_host


def target_from(config: dict) -> Target:
    """The daemon's listener from its validated config (``web.listen_address``, ``web.config_file``)."""
    web = typed_config(config).web
    host, port = web.listen_address.rsplit(":", 1)
    host = host.strip("[]")
    tls, required, sans = False, False, False
    web_config = web.config_file
    if web_config:
        # Only whether TLS is on and how clients authenticate: the daemon validated the whole file when it started,
        # and loading users would cost a bcrypt hash at their cost on every probe.
        raw = read_yaml(web_config)
        section = raw.get("tls_server_config") if isinstance(raw, dict) else None
        if section:
            tls = True
            if isinstance(section, dict):
                required = section.get("client_auth_type") in CLIENT_CERT_REQUIRED
                sans = bool(section.get("client_allowed_sans"))
    return Target(probe_host(host or None), int(port), tls, required, sans)


def ask(target: Target, timeout: float) -> str:
    """One GET /healthz; the line to print when the daemon answered, Unhealthy when it did not."""
    context = None
    if target.tls:
        # The probe runs beside the daemon and asks whether it answers, not who it is: the certificate is for the
        # names scrapers use, which 127.0.0.1 need not be, and the CA that signed it need not be in this image.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if target.client_cert_required:
        return _handshake(target, context, timeout)
    connection = (
        http.client.HTTPSConnection(target.host, target.port, timeout=timeout, context=context)
        if target.tls
        else http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    )
    try:
        connection.request("GET", "/healthz", headers={"User-Agent": "mfu-exporter-healthcheck"})
        response = connection.getresponse()
        body = response.read(200).decode("utf-8", "replace").strip()
    except ssl.SSLError as exc:
        raise Unhealthy(f"{target.url}: TLS error: {exc.reason or exc}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Unhealthy(f"{target.url}: {_describe(exc)}") from None
    finally:
        connection.close()
    if response.status == 200:
        return f"healthy: {target.url} answered 200 {body}"
    if response.status == 429:
        return f"healthy: {target.url} answered 429 (rate_limit of the web config): the daemon is serving"
    if response.status == 403 and target.allowed_sans:
        return f"healthy: {target.url} answered 403: client_allowed_sans refuses a probe without a certificate"
    raise Unhealthy(f"{target.url} answered {response.status} {body}")


def _handshake(target: Target, context: ssl.SSLContext, timeout: float) -> str:
    """A TLS handshake only, for a daemon that refuses clients without a certificate (this probe has none).

    The daemon's event loop runs its side of the handshake, so a server certificate coming back means the loop is
    serving; the daemon then refuses the probe (TLS 1.3 after the handshake, TLS 1.2 during it, after its
    certificate), which is as far as a probe without a certificate gets. A dead daemon refuses the connection and a
    hung one lets the handshake time out, so neither passes.
    """
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout) as raw:
            with context.wrap_socket(raw, do_handshake_on_connect=False) as tls:
                try:
                    tls.do_handshake()
                except ssl.SSLError as exc:
                    # TLS 1.2 refuses inside the handshake, with an alert or by closing: either is the daemon's
                    # loop acting (a dead daemon refuses the connection, a hung one lets it time out).
                    if not any(word in (exc.reason or "").upper() for word in ("HANDSHAKE_FAILURE", "UNEXPECTED_EOF")):
                        raise
                    return (
                        f"healthy: {target.url}: TLS server answered and requires a client certificate "
                        f"(refused during the handshake: {exc.reason})"
                    )
                if not tls.getpeercert(binary_form=True):
                    raise Unhealthy(f"{target.url}: the TLS server sent no certificate")
                return f"healthy: {target.url}: TLS server answered and requires a client certificate ({tls.version()})"
    except ssl.SSLError as exc:
        raise Unhealthy(f"{target.url}: TLS error: {exc.reason or exc}") from None
    except OSError as exc:
        raise Unhealthy(f"{target.url}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "no answer within the timeout"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- the daemon's own settings, from /proc/<pid> ------------------------------------------------------------


def daemon_argv(cmdline: list[str], pid: int) -> list[str]:
    """The flags of ``run`` in a daemon's command line (``mfu-exporter [run] ...`` or ``python -m mfu_exporter [run] ...``)."""
    for at, word in enumerate(cmdline):
        if os.path.basename(word) == "mfu-exporter" or (word == "mfu_exporter" and at > 0 and cmdline[at - 1] == "-m"):
            rest = cmdline[at + 1 :]
            break
    else:
        raise Unhealthy(f"process {pid} is not mfu-exporter: {' '.join(cmdline)[:200]}")
    if rest and rest[0] == "run":
        return rest[1:]
    if rest and not rest[0].startswith("-"):
        raise Unhealthy(f"process {pid} runs mfu-exporter {rest[0]}, not the daemon")
    return rest


def read_process(pid: int, proc: str = "/proc") -> tuple[list[str], dict[str, str], str]:
    """(command line, MFU_EXPORTER_* environment, working directory) of process ``pid``."""
    base = Path(proc) / str(pid)
    try:
        cmdline = [arg.decode("utf-8", "surrogateescape") for arg in (base / "cmdline").read_bytes().split(b"\0")[:-1]]
        environ = (base / "environ").read_bytes().split(b"\0")
        cwd = os.readlink(base / "cwd")
    except OSError as exc:
        raise Unhealthy(f"cannot read the daemon's settings from {base}: {exc.strerror or exc}") from None
    env = {}
    for entry in environ:
        key, sep, value = entry.decode("utf-8", "surrogateescape").partition("=")
        if sep and key.startswith(ENV_PREFIX):
            env[key] = value
    if not cmdline:
        raise Unhealthy(f"process {pid} has no command line (a zombie or a kernel thread)")
    return cmdline, env, cwd


# --- the command ------------------------------------------------------------------------------------------------


def add_healthcheck_flags(parser: argparse.ArgumentParser) -> None:
    add_daemon_flags(parser)
    parser.add_argument(
        "--daemon-pid",
        type=int,
        metavar="PID",
        help="read the flags and MFU_EXPORTER_* env of the running daemon PID (/proc/PID) instead of "
        "this command's; the image's HEALTHCHECK passes 1, the container's main process",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=4.0,
        metavar="SECONDS",
        help="give up on an answer after this long (default 4; keep it under HEALTHCHECK --timeout)",
    )


def daemon_settings(pid: int) -> argparse.Namespace:
    """The daemon's flags as ``run`` parsed them: its command line, with its MFU_EXPORTER_* env as the defaults.

    Relative paths in them are the daemon's, so this process moves to the daemon's working directory.
    """
    cmdline, env, cwd = read_process(pid)
    argv = daemon_argv(cmdline, pid)
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(env)
    parser = argparse.ArgumentParser(prog=f"mfu-exporter (process {pid})", add_help=False, exit_on_error=False)
    add_daemon_flags(parser)
    try:
        args, _ = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise Unhealthy(f"cannot read the flags of process {pid}: {exc}") from None
    for value in vars(args).values():
        if isinstance(value, BadEnv):
            raise value.error()
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise Unhealthy(f"cannot enter the daemon's working directory {cwd}: {exc.strerror}") from None
    return args


def run_healthcheck(args: argparse.Namespace) -> int:
    try:
        settings = daemon_settings(args.daemon_pid) if args.daemon_pid is not None else args
        line = ask(target_from(load_daemon_config(settings)), args.timeout)
    except (Unhealthy, ConfigError) as exc:
        print(f"unhealthy: {exc}", flush=True)
        return EXIT_UNHEALTHY
    print(line, flush=True)
    return EXIT_HEALTHY
