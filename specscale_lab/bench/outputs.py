"""What a sub-command writes: the run record (`run_info`: command, git commit, machine, load, the testbed's
settings; `finish_info`), `raw.json`, `summary.json` (results keyed by variant, then beam size), `<name>.md`
with its header and tables (`markdown_table`, `cell`, `flush_text`) and `<name>.png` (`new_figure`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from specscale_lab.bench.machine import QUIET_CPU, git_commit, machine_info, other_cpu_busy
from specscale_lab.bench.testbed import Testbed

VLLM_SELECTION = frozenset({"generator_backend", "verifier_backend", "vllm_arg"})  # what only vLLM runs read
SIMULATION_ONLY = frozenset({"hardware", "dataset", "workload", "prm_kv_share", "perfect_share"})
IGNORED_BY_BACKEND = {  # options a backend does not read (left out of the recorded command line)
    "real": SIMULATION_ONLY | VLLM_SELECTION | {"backend"},
    "sim": VLLM_SELECTION | {"kv_gb", "prm_kv_gb", "device", "dtype"},
    "vllm": SIMULATION_ONLY,
}
IGNORED_BY_BACKEND["engine"] = IGNORED_BY_BACKEND["real"]  # `eval --backend engine|vllm` (solve's flags)
REPEATABLE = frozenset({"vllm_arg"})  # options given once per value (action="append")
SWITCHES_ON_BY_DEFAULT = frozenset({"profile_prm"})  # --X / --no-X options (argparse.BooleanOptionalAction)


def run_info(name: str, args, testbed: Testbed | None = None, command: str | None = None) -> dict:
    """What reproduces and qualifies a result: command, code version, machine, load, settings (the
    testbed's: models, or the simulated hardware and workload). command: how the run was asked for
    (`specscale bench`, or `specscale simulate` when that is the command parsed)."""
    command = command or f"specscale {getattr(args, 'command', None) or 'bench'}"
    info = {
        "benchmark": name,
        "command": command_line(name, args, command),
        "argv": sys.argv,
        "git_commit": git_commit(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average_start": os.getloadavg(),
        "other_cpu_busy_start": other_cpu_busy(),
        "quick": args.quick,
    }
    if testbed is not None:
        info.update(testbed.describe())
    return info


def command_line(name: str, args, command: str = "specscale bench") -> str:
    """`<command> <name>` (`specscale bench <name>` by default) with every option spelled out, as parsed,
    but those the run's backend does not read."""
    parts = [*command.split(), name]
    unread = IGNORED_BY_BACKEND[getattr(args, "backend", "real")]
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command", "bench_command") or key in unread or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is False:  # a switch that is on by default is recorded when off; store_true ones are left out
            parts += [f"--no-{flag[2:]}"] if key in SWITCHES_ON_BY_DEFAULT else []
        elif value is True:
            parts.append(flag)
        elif key in REPEATABLE:
            parts += [part for item in value for part in (flag, str(item))]
        elif isinstance(value, (list, tuple)):
            parts += [flag, ",".join(map(str, value))]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def finish_info(info: dict, started: float) -> dict:
    """Add the run's duration and the load at its end (our own process counts in it)."""
    return dict(info, duration_s=time.perf_counter() - started, load_average_end=os.getloadavg(),
                busy_machine=info["other_cpu_busy_start"] > QUIET_CPU)


def write_outputs(out: str | Path, name: str, info: dict, raw, results: dict, markdown: str, figure,
                  extra: dict | None = None) -> Path:
    """raw.json (every run), summary.json (results[variant][beam size] + extras), <name>.md, <name>.png."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw.json").write_text(json.dumps({"run": info, "runs": raw}, indent=2, default=str) + "\n")
    summary = {"run": info, "results": results, **(extra or {})}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (folder / f"{name}.md").write_text(header_markdown(name, info) + markdown + f"\n![{name}]({name}.png)\n")
    figure.savefig(folder / f"{name}.png", dpi=110)
    return folder


def header_markdown(name: str, info: dict) -> str:
    machine = info["machine"]
    load = info["other_cpu_busy_start"]
    simulated = info.get("backend") == "sim"  # simulated times do not depend on the machine's load
    busy = " — **busy machine: timings are not trustworthy**" if info.get("busy_machine") and not simulated else ""
    title = info["command"].split(" --")[0].split(" ")[:2]
    return (f"# {' '.join(title)} {name}\n\n```bash\n{info['command']}\n```\n\n"
            f"commit `{info['git_commit']}`, {machine['cpu']} ({machine['cpu_count']} CPUs, "
            f"{machine['torch_threads']} torch threads), {load:.0%} of the CPUs busy with other work at start{busy}, "
            f"{info.get('duration_s', 0.0):.0f} s{' (quick mode)' if info['quick'] else ''}.\n\n"
            + kernels_markdown(info) + simulated_markdown(info))


def kernels_markdown(info: dict) -> str:
    """For a run on checkpoints: the machine's ISA and the kernel paths each model took."""
    kernels = info.get("kernels") or {}
    if not kernels:
        return ""
    paths = "; ".join(role_kernels(role, report) for role, report in kernels.items())
    return f"Machine: {info['machine'].get('isa', '')}. Kernels ({paths}).\n\n"


def role_kernels(role: str, report: dict | str) -> str:
    """One model's kernel paths (our engine's report), or the engine that runs it (vLLM's: `VllmStack.kernels`)."""
    if isinstance(report, str):
        return f"{role}: {report}"
    return (f"{role}: linears {report.get('linear_paths')}, attention {report.get('attention')}, "
            f"prefill attention {report.get('prefill_attention')}")


def simulated_markdown(info: dict) -> str:
    """For a simulated run: the device and workload simulated; every time in the report is simulated."""
    if info.get("backend") != "sim":
        return ""
    hardware, workload, models = info["hardware"], info["workload"], info["models"]
    return (f"**Simulated** (docs/simulator.md): {models['generator']} + {models['prm']} on {hardware['name']}, "
            f"workload `{workload['name']}`, {info['kv_blocks']:,} generator / {info['prm_kv_blocks']:,} PRM KV "
            f"blocks, LV threshold {info['lv_threshold_tokens']:,} tokens. Times and rates are simulated "
            f"seconds.\n\n")


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table; numbers right-aligned and formatted by `cell`."""
    align = ["---" if i == 0 else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def cell(value) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if magnitude >= 0.1 or value == 0 else f"{value:.3g}"


def flush_text(reasons: dict | None) -> str:
    """A cell's flush reasons for a table: "sibling-group 916, deferrals 71" (none: "–")."""
    if not reasons:
        return "–"
    return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))


def new_figure(rows: int, cols: int, width: float = 6.0, height: float = 4.0):
    """A matplotlib figure on the Agg backend (no display), with its axes as a flat list."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, [ax for row in axes for ax in row]
