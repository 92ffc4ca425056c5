"""The machine a run ran on, as its record states it: the code's git commit, the CPU, ISA and torch threads
(`machine_info`), and the share of the CPUs other processes kept busy (`other_cpu_busy`; above QUIET_CPU a
report flags its timings as untrustworthy)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from specscale.model.machine import MachineFingerprint

QUIET_CPU = 0.15  # share of all CPUs busy with other processes above which timings are flagged untrustworthy


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from, '+dirty' when tracked files changed; None if none."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "isa": MachineFingerprint.current().describe(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cpu",
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def other_cpu_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over ``seconds`` while this process sleeps, i.e. busy with other work
    (unlike the load average, this does not count the sub-command that ran just before). 0 when
    ``/proc/stat`` is missing."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)
    if not Path("/proc/stat").is_file():
        return 0.0
    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)
