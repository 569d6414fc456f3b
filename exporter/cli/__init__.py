"""Command line: ``mfu-exporter [run]`` starts the daemon. Flags follow Prometheus style; each has an env var."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from exporter import __version__
from exporter.cli import check, demo, healthcheck, nccl, plan, run
from exporter.cli.flags import EXIT_CONFIG, BadEnv, UsageError
from exporter.config import ConfigError

log = logging.getLogger("exporter")

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

# Every command, in --help order: (help, add its flags, run it). A static table: nothing registers on import.
COMMANDS: dict[str, tuple[str, Configure, Run]] = {
    "run": (run.RUN_HELP, run.add_run_flags, run.run_daemon),
    "check": (check.CHECK_HELP, check.add_check_flags, check.run_check),
    "nccl": (nccl.NCCL_HELP, nccl.add_nccl_flags, nccl.run_nccl),
    "plan": (plan.PLAN_HELP, plan.add_plan_flags, plan.run_plan),
    "demo": (demo.DEMO_HELP, demo.add_demo_flags, demo.run_demo),
    "healthcheck": (healthcheck.HEALTHCHECK_HELP, healthcheck.add_healthcheck_flags, healthcheck.run_healthcheck),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mfu-exporter",
        description="Prometheus exporter and live MFU monitor for LLM training nodes. With no command, runs the daemon.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the epilog's flag table as formatted
    )
    parser.add_argument("--version", action="version", version=f"mfu-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, runner) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
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


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
    except UsageError as exc:
        print(f"mfu-exporter {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
