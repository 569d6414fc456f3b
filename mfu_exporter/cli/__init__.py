"""Command line: ``mfu-exporter [run]`` starts the daemon. Flags follow Prometheus style; each has an env var."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Callable

from mfu_exporter import __version__
from mfu_exporter.cli.flags import EXIT_CONFIG, BadEnv, UsageError
from mfu_exporter.config import ConfigError

log = logging.getLogger("mfu_exporter")

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

# Every command, in --help order: (help, its module, the module's function that adds its flags, the one that runs
# it). A static table: nothing registers on import. A command's module is imported when its flags are needed, so the
# daemon never loads the demo's simulation (gRPC, requests: some 20 MB resident).
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "run": ("Run the exporter daemon (the default command).", "run", "add_run_flags", "run_daemon"),
    "check": (
        "Check this node for what a distributed training job needs (read-only); exit 1 when a check FAILs.",
        "check",
        "add_check_flags",
        "run_check",
    ),
    "nccl": (
        "Judge an NCCL test's output (nccl-tests, NCCL_DEBUG=INFO) against this node's fabric; exit 1 on FAIL.",
        "nccl",
        "add_nccl_flags",
        "run_nccl",
    ),
    "plan": (
        "Size a training run with the guide's t_train = 6·P·D / (N·T_peak·MFU).",
        "plan",
        "add_plan_flags",
        "run_plan",
    ),
    "demo": (
        "Run a simulated 8-GPU training node through the real exporter, with live MFU and incidents.",
        "demo",
        "add_demo_flags",
        "run_demo",
    ),
    "healthcheck": (
        "Ask the daemon's /healthz over HTTP or HTTPS, as its own settings say (for Docker HEALTHCHECK).",
        "healthcheck",
        "add_healthcheck_flags",
        "run_healthcheck",
    ),
}


def command(name: str) -> tuple[Configure, Run]:
    """The command's (add its flags, run it), its module imported now."""
    _, module_name, configure, runner = COMMANDS[name]
    module = importlib.import_module(f"mfu_exporter.cli.{module_name}")
    return getattr(module, configure), getattr(module, runner)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with ``only``, the flags of that command and of ``run`` (the top-level help lists
    them) and the others' names and help alone."""
    parser = argparse.ArgumentParser(
        prog="mfu-exporter",
        description="Prometheus exporter and live MFU monitor for LLM training nodes. With no command, runs the daemon.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the epilog's flag table as formatted
    )
    parser.add_argument("--version", action="version", version=f"mfu-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, *_) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if only is None or name in (only, "run"):
            configure, runner = command(name)
            configure(sub)
            sub.set_defaults(run=runner)
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


def parser_of(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    """The subcommand's own parser (its usage and flags), or the top level's when there is none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def quiet_closed_pipe(code: int) -> int:
    """After stdout's reader went away (``| head``): stdout points at /dev/null, so the interpreter's last flush
    at exit raises nothing and no traceback is printed; ``code`` is the exit status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return code


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "run")
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse hands a subcommand's unknown flags up to the top level, whose usage would not name them.
        parser_of(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        for value in vars(args).values():
            if isinstance(value, BadEnv):
                raise value.error()
        setup_logging(getattr(args, "log_level", None) or "info")
        return args.run(args)
    except BrokenPipeError:
        return quiet_closed_pipe(1)
    except ConfigError as exc:
        print(f"mfu-exporter: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except UsageError as exc:
        print(f"mfu-exporter {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
