"""`gpu-admission` command line: one subcommand per module, each owning its arguments and its run()."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import UserError

PACKAGE = "gpu-admission"

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

_COMMON_EXITS = "  2    bad input: a file, document, field or option to fix (named in the message)\n  130  interrupted"

# subcommand -> its --help epilog: the exit codes and examples, as kubectl and conftest show them.
EPILOGS: dict[str, str] = {
    "check": f"""\
exit codes:
  0    every pod admitted (with --fail-on-warn: and no warning)
  1    at least one pod denied (with --fail-on-warn: or a warning printed)
{_COMMON_EXITS}

examples:
  gpu-admission check examples/                       # against the embedded demo cluster
  gpu-admission check --cluster cluster.yaml -n ml deploy/
  kubectl get nodes,namespaces,resourcequotas -o yaml > cluster.yaml
  helm template chart/ | gpu-admission check --cluster cluster.yaml -o junit -
  gpu-admission check --kubeconfig ~/.kube/config --fail-on-warn -o table job.yaml""",
    "serve": """\
exit codes:
  0    stopped
  2    bad input: a file, document, field or option to fix (named in the message)
  3    a part this installation lacks
  130  interrupted

examples:
  gpu-admission serve --in-cluster --cert-dir /certs --policy /etc/gpu-admission/policy.yaml
  gpu-admission serve --cluster cluster.yaml       # answer from files, a development certificate""",
    "certs": f"""\
exit codes:
  0    certificate written (or kept: still valid)
{_COMMON_EXITS}

examples:
  gpu-admission certs --service gpu-admission --namespace gpu-admission --out certs/
  gpu-admission certs --service gpu-admission --namespace gpu-admission \\
      --secret gpu-admission-tls --patch-webhook gpu-admission""",
    "agent": """\
exit codes:
  0    done (--once), or stopped
  1    discovery or publishing failed (with --once)
  2    bad input: a file, document, field or option to fix (named in the message)
  3    NVML is not available on this machine
  130  interrupted

examples:
  gpu-admission agent --once --print        # show what this node would publish
  gpu-admission agent --node-name $NODE_NAME""",
    "snapshot": f"""\
exit codes:
  0    written
{_COMMON_EXITS}

examples:
  gpu-admission snapshot -o cluster.yaml && gpu-admission check --cluster cluster.yaml deploy/
  gpu-admission snapshot --context prod -o -""",
    "simulate": f"""\
exit codes:
  0    done
{_COMMON_EXITS}

examples:
  gpu-admission simulate --trace-dir openb/ --policy all --seeds 42-44
  gpu-admission simulate --nodes nodes.csv --pods pods.csv --policy fgd,fragmentation -o csv""",
    "completion": """\
exit codes:
  0    the script was printed
  2    no shell, or one other than bash or zsh

examples:
  eval "$(gpu-admission completion bash)"            # in ~/.bashrc
  gpu-admission completion zsh > ~/.zfunc/_gpu-admission
""",
    "version": """\
exit codes:
  0    printed

examples:
  gpu-admission version
  gpu-admission --version""",
}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Text of several lines (the epilogs) as written; a one-line description wrapped to the terminal."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


def version() -> str:
    """The installed distribution's version; "unknown" when run from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(PACKAGE)
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(args: argparse.Namespace) -> int:
    print(f"{PACKAGE} {version()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-admission", description="GPU admission controller for Kubernetes")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sp = _command(sub, name, help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # a missing optional part must not take the other commands down
            sp.set_defaults(_run=_unavailable(name, err))
            continue
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    sp = _command(sub, "version", "print the version")
    sp.set_defaults(_run=_print_version)
    sp = _command(
        sub,
        "completion",
        "print a shell completion script",
        "Print a completion script for bash or zsh, made from this installation's commands and options.",
    )
    sp.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    sp.set_defaults(_run=lambda args: _print_completion(parser, args.shell))
    return parser


def _command(sub: Any, name: str, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
    """One subcommand's parser: its help line, description and the exit codes and examples of EPILOGS."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        epilog=EPILOGS.get(name),
        formatter_class=_HelpFormatter,
    )
    return parser


def _print_completion(parser: argparse.ArgumentParser, shell: str) -> int:
    """A bash completion function (zsh loads it through bashcompinit): commands first, then each
    command's options, and file names for everything else."""
    commands: dict[str, tuple[list[str], list[str]]] = {}
    for action in parser._actions:  # argparse keeps no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = sorted({o for a in sub._actions for o in a.option_strings})
                choices = sorted(
                    {str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices}
                )
                commands[name] = (options, choices)
    cases = "\n".join(
        f'    {name}) opts="{" ".join(o)}"; choices="{" ".join(c)}" ;;' for name, (o, c) in sorted(commands.items())
    )
    script = f"""# gpu-admission {shell} completion: eval "$(gpu-admission completion {shell})"
{"autoload -U +X bashcompinit && bashcompinit" if shell == "zsh" else ""}
_gpu_admission() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" opts="" choices=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{" ".join(sorted(commands))} --version --help" -- "$cur"))
    return
  fi
  case "${{COMP_WORDS[1]}}" in
{cases}
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  elif [ -n "$choices" ]; then
    COMPREPLY=($(compgen -W "$choices" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}}
complete -o filenames -F _gpu_admission gpu-admission
"""
    sys.stdout.write(script)
    return 0


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
