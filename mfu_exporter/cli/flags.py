"""Flags in Prometheus style, each with its env var (``--web.listen-address`` ↔ MFU_EXPORTER_WEB_LISTEN_ADDRESS)."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from mfu_exporter.config import ConfigError, Invalid, listen_address, load_config

EXIT_CONFIG = 2  # a config or usage error: every command exits 2 when its input is refused


class UsageError(Exception):
    """A flag combination a command refuses; ``main`` prints it after the command's name and exits 2."""


PATH_FLAGS = (("--path.sysfs", "sysfs"), ("--path.procfs", "procfs"))


def require_path_flags(args: argparse.Namespace) -> None:
    """``--path.sysfs`` and ``--path.procfs`` must name directories: a root naming nothing would read nothing and
    pass every check. Checked when a command starts, not when the flags are parsed, so a DaemonSet's arguments
    (``--path.sysfs=/host/sys``) parse anywhere and are refused only where the command would run on them."""
    for flag, dest in PATH_FLAGS:
        value = getattr(args, dest)
        if not os.path.isdir(value):
            why = "not a directory" if os.path.exists(value) else "no such path"
            raise UsageError(f"{flag} (or {env_name(flag)}): expected an existing directory, got {value!r} ({why})")


def positive(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``convert`` (float or int), then above zero. Its errors say what the flag takes."""

    def parse(value: str) -> Any:
        try:
            number = convert(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not (math.isfinite(number) and number > 0):
            raise argparse.ArgumentTypeError(f"{value!r}: must be positive and finite")
        return number

    parse.__name__ = f"positive {convert.__name__}"
    return parse


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


def _env_default(
    flag: str, env: str, value: str, convert: Callable[[str], Any] | None, choices: Iterable[str] | None
) -> Any:
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
    add_flag(
        parser,
        "--path.sysfs",
        "sysfs mount point; must exist",
        dest="sysfs",
        default="/sys",
        metavar="DIR",
        metavar_default="/sys",
    )
    add_flag(
        parser,
        "--path.procfs",
        "procfs mount point; must exist",
        dest="procfs",
        default="/proc",
        metavar="DIR",
        metavar_default="/proc",
    )


def add_daemon_flags(parser: argparse.ArgumentParser, paths: bool = True) -> None:
    """The daemon's flags; ``paths=False`` leaves out ``--path.sysfs`` and ``--path.procfs`` (the demo reads trees of
    its own, ``mfu_exporter.cli.demo``)."""
    add_flag(parser, "--config", "YAML config file; every key optional", metavar="FILE")
    add_flag(
        parser,
        "--web.listen-address",
        "HOST:PORT to serve on; overrides web.listen_address",
        dest="listen_address",
        metavar="HOST:PORT",
        metavar_default=":9495",
    )
    add_flag(
        parser,
        "--web.config.file",
        "exporter-toolkit web config (TLS, basic auth)",
        dest="web_config_file",
        metavar="FILE",
    )
    if paths:
        add_path_flags(parser)
    add_flag(
        parser,
        "--log.level",
        "debug, info, warning or error (any case)",
        dest="log_level",
        default="info",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        metavar_default="info",
    )


def apply_web_flags(config: dict, args: argparse.Namespace) -> dict:
    """``--web.listen-address`` and ``--web.config.file`` over the config's ``web`` section (flags win)."""
    if args.listen_address:
        try:
            config["web"]["listen_address"] = listen_address(args.listen_address)
        except Invalid as exc:
            raise ConfigError("--web.listen-address", "", exc.expected, args.listen_address) from None
    if args.web_config_file:
        config["web"]["config_file"] = args.web_config_file
    return config


def load_daemon_config(args: argparse.Namespace) -> dict:
    return apply_web_flags(load_config(args.config), args)
