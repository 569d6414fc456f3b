"""Command line: ``mfu-exporter [run]`` starts the daemon. Flags follow Prometheus style; each has an env var."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from aiohttp import web

from exporter import __version__
from exporter.config import ConfigError, Invalid, listen_address, load_config
from exporter.runtime import Paths, Runtime, build_runtime, build_sources, require_sources
from exporter.server import create_app
from exporter.websecurity import HTTP_LIMITS, WEB_SECURITY

log = logging.getLogger("exporter")

EXIT_CONFIG = 2


def env_name(flag: str) -> str:
    return "MFU_EXPORTER_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


@dataclass(frozen=True)
class BadEnv:
    """An env var whose value does not fit its flag; stands as the flag's default until the flag is parsed.

    argparse never checks a default against ``choices``, so ``add_flag`` checks the env value itself. The error
    waits in the parsed namespace rather than being raised while the parser is built, so a bad value only stops
    the commands that use the flag, and a value on the command line overrides it as it would a good one.
    """

    env: str
    expected: str
    value: str

    def error(self) -> ConfigError:
        return ConfigError(self.env, "", self.expected, self.value)


def add_flag(parser: argparse.ArgumentParser, flag: str, help: str, **kwargs) -> None:
    """A flag whose default comes from its env var (``--web.listen-address`` ↔ MFU_EXPORTER_WEB_LISTEN_ADDRESS)."""
    env = env_name(flag)
    default = kwargs.pop("default", None)
    shown = f" (env {env}" + (f", default {kwargs['metavar_default']}" if "metavar_default" in kwargs else "") + ")"
    kwargs.pop("metavar_default", None)
    if env in os.environ:
        default = _env_default(flag, env, os.environ[env], kwargs.get("type"), kwargs.get("choices"))
    parser.add_argument(flag, default=default, help=help + shown, **kwargs)


def _env_default(flag: str, env: str, value: str, convert: Callable[[str], Any] | None,
                 choices: Iterable[str] | None) -> Any:
    """The env value as the flag would parse it, or a ``BadEnv`` saying what was expected."""
    parsed: Any = value
    if convert is not None:
        try:
            parsed = convert(value)
        except argparse.ArgumentTypeError as exc:  # the flag's own wording of what it takes
            return BadEnv(env, str(exc), value)
        except (TypeError, ValueError):
            return BadEnv(env, f"a {getattr(convert, '__name__', 'valid')} value, as {flag} takes", value)
    if choices is not None and parsed not in choices:
        return BadEnv(env, "one of " + ", ".join(choices), value)
    return parsed


def add_path_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--path.sysfs", "sysfs mount point", dest="sysfs", default="/sys", metavar="DIR", metavar_default="/sys")
    add_flag(parser, "--path.procfs", "procfs mount point", dest="procfs", default="/proc", metavar="DIR", metavar_default="/proc")


def add_daemon_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--config", "YAML config file; every key optional", metavar="FILE")
    add_flag(parser, "--web.listen-address", "HOST:PORT to serve on; overrides web.listen_address",
             dest="listen_address", metavar="HOST:PORT", metavar_default=":9495")
    add_flag(parser, "--web.config.file", "exporter-toolkit web config (TLS, basic auth)", dest="web_config_file", metavar="FILE")
    add_path_flags(parser)
    add_flag(parser, "--log.level", "debug, info, warning or error (any case)", dest="log_level", default="info",
             type=str.lower, choices=["debug", "info", "warning", "error"], metavar_default="info")


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    def register(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (help, configure, run)
        return run

    return register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mfu-exporter",
        description="Prometheus exporter and live MFU monitor for LLM training nodes. With no command, runs the daemon.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the epilog's flag table as formatted
    )
    parser.add_argument("--version", action="version", version=f"mfu-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        configure(sub)
        sub.set_defaults(run=run)
    parser.epilog = run_flags_help(commands.choices["run"])
    return parser


def run_flags_help(run: argparse.ArgumentParser) -> str:
    """The daemon's flags with their env vars, for the top-level --help: ``mfu-exporter --config FILE`` runs the
    daemon, so its flags are what a person reading the top-level help is looking for."""
    formatter = run._get_formatter()
    formatter.start_section("flags of run, the default command (each also read from its env var)")
    formatter.add_arguments([action for action in run._actions if action.option_strings and action.dest != "help"])
    formatter.end_section()
    return formatter.format_help().strip() + "\n\nEach command's own flags: mfu-exporter COMMAND --help"


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def load_daemon_config(args: argparse.Namespace) -> dict:
    config = load_config(args.config)
    if args.listen_address:
        try:
            config["web"]["listen_address"] = listen_address(args.listen_address)
        except Invalid as exc:
            raise ConfigError("--web.listen-address", "", exc.expected, args.listen_address) from None
    if args.web_config_file:
        config["web"]["config_file"] = args.web_config_file
    return config


def split_listen_address(address: str) -> tuple[str | None, int]:
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    return (host or None), int(port)


async def serve(runtime: Runtime, on_started: Callable[[list[str]], None] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop``), then shut down within a few seconds."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = create_app(runtime)
    security = app[WEB_SECURITY]
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, access_log=None, **HTTP_LIMITS)
    await runner.setup()
    host, port = split_listen_address(runtime.config["web"]["listen_address"])
    ssl_context = security.server_ssl_context()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise SystemExit(f"mfu-exporter: cannot listen on {runtime.config['web']['listen_address']}: {exc.strerror}") from None
    scheme = "https" if ssl_context else "http"
    urls = [f"{scheme}://{'localhost' if host in (None, '0.0.0.0', '::') else host}:{port}/"]
    log.info("mfu-exporter %s listening on %s (%s)", __version__, runtime.config["web"]["listen_address"], scheme)
    security.warn_if_exposed(runtime.config["web"]["listen_address"])
    if on_started:
        on_started(urls)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()


@command("run", "Run the exporter daemon (the default command).", add_daemon_flags)
def run_daemon(args: argparse.Namespace) -> int:
    config = load_daemon_config(args)
    sources = build_sources(config, Paths(args.sysfs, args.procfs))
    require_sources(config, sources, args.config)
    runtime = build_runtime(config, sources)
    asyncio.run(serve(runtime))
    return 0


# Commands that live beside their subject; registered after the registry above exists.
from exporter import demo, plan, preflight  # noqa: E402

command("check", preflight.CHECK_HELP, preflight.add_check_flags)(preflight.run_check)
command("plan", plan.PLAN_HELP, plan.add_plan_flags)(plan.run_plan)
command("demo", demo.DEMO_HELP, demo.add_demo_flags)(demo.run_demo)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "run")
    args = build_parser().parse_args(argv)
    try:
        for value in vars(args).values():
            if isinstance(value, BadEnv):
                raise value.error()
        setup_logging(getattr(args, "log_level", None) or "info")
        return args.run(args)
    except ConfigError as exc:
        print(f"mfu-exporter: {exc}", file=sys.stderr)
        return EXIT_CONFIG
