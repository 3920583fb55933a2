"""The `agentserve` command: a thin dispatcher. Each subcommand's module is imported only when that subcommand
runs (`agentserve serve` loads no benchmark); `agentserve --help` lists them all without importing any.
Bad input ends in one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

EXIT_BAD_INPUT = 2

# name: (the module whose `register(sub)` adds it, and maybe its siblings; the one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("engine.cli", "run one request through the engine and print the result"),
    "serve": ("gateway.cli", "run the gateway with its embedded engine"),
    "bench": ("agents_eval.bench.cli", "benchmarks (agents_eval); each writes report.json, report.md, a plot"),
    "qos": ("engine.transport.qos", "traffic classes from configs/qos.yaml: DSCP marks, InfiniBand opensm QoS"),
    "keys": ("gateway.cli", "API keys"),
    "predictor": ("predictor.cli", "next-turn load forecasting: train and evaluate the LSTM, replay the forecast"),
    "simulate": ("agents_eval.sim.cli", "cluster simulator: the project's policies on simulated nodes"),
    "profile": ("agents_eval.sim.cli", "record the real engine's step times; write a calibration file"),
    "tune": ("engine.capacity.tune", "decode concurrency and prefill batch size for a model on a GPU"),
    "monitor": ("gateway.monitor", "live view of a metric, the role split and alerts"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: the chosen command's module registers its full parser, every other command is a
    stub that only names it (so an unknown or missing command is reported with the full list)."""
    parser = argparse.ArgumentParser(prog="agentserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    chosen_module = COMMANDS[chosen][0] if chosen in COMMANDS else None
    for name, (module, help_text) in COMMANDS.items():
        if name in sub.choices:
            continue
        if module == chosen_module:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def exit_on_sigterm() -> None:
    """SIGTERM exits through SystemExit, so `finally` blocks run: a benchmark stopped this way stops the
    servers it started instead of leaving them behind (`serve` installs uvicorn's own handler over this)."""
    def _exit(signum: int, frame: object) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    run: Callable[[argparse.Namespace], None] = args.run
    exit_on_sigterm()
    try:
        run(args)
    except ValueError as error:  # RequestError, ModelLoadError, TokenizerNotFoundError, CLIError
        print(f"agentserve: error: {error}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `agentserve ... | head`: the reader is gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(141)


if __name__ == "__main__":
    main()
