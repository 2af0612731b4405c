"""`gpu-admission` command line: one subcommand per module, each owning its arguments and its run()."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from .errors import UserError

# subcommand -> (module, help). Each module has add_arguments(parser) and run(args) -> int, and keeps
# heavy imports inside run() so that `gpu-admission --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("webhook.commands.check", "decide GPU pods in manifests offline, exactly as the webhook will"),
    "serve": ("webhook.commands.serve", "run the admission webhook (gunicorn, TLS)"),
    "certs": ("webhook.commands.certs", "make a CA and a serving certificate"),
    "agent": ("webhook.commands.agent", "node agent: discover GPUs with NVML and publish a GPUInventory"),
    "snapshot": ("webhook.commands.snapshot", "write the cluster objects that `check --cluster` reads"),
    "simulate": ("webhook.commands.simulate", "replay a GPU cluster trace through the placement policies"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-admission", description="GPU admission controller for Kubernetes")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # a missing optional part must not take the other commands down
            sp.set_defaults(_run=_unavailable(name, err))
            continue
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    return parser


def _unavailable(name: str, err: ImportError) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise UserError(f"the {name} command is unavailable in this installation: {err}", exit_code=3)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args._run(args)
    except UserError as err:
        print(f"gpu-admission {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
