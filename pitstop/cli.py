"""The ``pitstop`` command: one entry point, one subcommand per component.

Each component owns its own argument parser (``prog="pitstop <name>"``) so that ``pitstop <name> --help``
explains itself; this module only dispatches, and imports a component lazily so a GPU node that installed
``pitstop[agent]`` never needs the control plane's dependencies.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# name -> (module, function, one-line summary)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "agent": ("agent.cli", "main", "run the node agent: supervise vLLM replicas, collect GPU and engine signals"),
    "server": ("controlplane.cli", "main", "run the control plane (API, store, scheduler); 'server --help' for more"),
    "console": ("controlplane.console.launch", "main", "open the Streamlit ops console"),
    "sim": ("enginesim.cli", "main", "vLLM-compatible engine simulator: 'pitstop sim serve MODEL [vllm flags]'"),
    "policy": ("controlplane.policy_cli", "main", "check remediation policy files, explain what they would do"),
    "dashboards": ("pitstop.dashboards", "main", "push the Grafana dashboards through Grafana's HTTP API"),
    "files": ("pitstop.files", "main", "where the shipped dashboards, alert rules, runbooks and policies are"),
    "demo": ("pitstop.demo", "main", "control plane + agent + four simulated replicas + console + load"),
    # On-call's terminal: the console's reads and safe actions through the API (token: PITSTOP_TOKEN).
    "status": ("pitstop.opscli", "status_main", "the fleet at a glance: SLO status per model, nodes, automation"),
    "replicas": ("pitstop.opscli", "replicas_main", "replicas with latency, queue, KV cache, memory [--model M]"),
    "actions": ("pitstop.opscli", "actions_main", "what Pitstop and operators did, with outcomes [--follow]"),
    "restart": ("pitstop.opscli", "restart_main", "restart NODE/REPLICA through the guardrails [--dry-run]"),
    "drain": ("pitstop.opscli", "drain_main", "drain and stop NODE/REPLICA through the guardrails [--dry-run]"),
    "rollout": ("pitstop.opscli", "rollout_main", "rolling restart of MODEL within its budget [--dry-run]"),
    "cordon": ("pitstop.opscli", "cordon_main", "fence NODE or NODE/GPU: its replicas drain [--dry-run]"),
    "uncordon": ("pitstop.opscli", "uncordon_main", "give a fenced NODE or NODE/GPU back [--dry-run]"),
    "silence": ("pitstop.opscli", "silence_main", "add, list or expire silences of alerts"),
}

USAGE = "usage: pitstop [-h] [--version] {" + ",".join(COMMANDS) + "} ..."


def _help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        USAGE,
        "",
        "Pitstop keeps vLLM fleets fast and healthy: node agents supervise engines and collect signals,",
        "the control plane stores fleet state and remediates, the console shows it.",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, _, summary) in COMMANDS.items()]
    lines += ["", "Run 'pitstop COMMAND --help' for a command's options. Every command runs with no config file."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if args else 2
    if args[0] == "--version":
        from pitstop import __version__

        print(f"pitstop {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"{USAGE}\npitstop: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})",
              file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        extra = "agent" if name == "agent" else "server"
        print(f"pitstop {name}: missing dependency {exc.name!r}; install 'pitstop[{extra}]'", file=sys.stderr)
        return 2
    func: Callable[[list[str]], int] = getattr(module, func_name)
    return func(rest)


if __name__ == "__main__":
    raise SystemExit(main())
