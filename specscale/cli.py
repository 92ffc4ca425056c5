"""Command line: `specscale <command>`. Each command lives in its own module; this file only dispatches.

The system's own commands (`profile-prm`, `serve`) are added here; the lab's (`generate`, `solve`, `bench`,
`eval`, `simulate`, `trace`) come through the plugin seam below, so that the system never imports the lab:
each entry point of the group `specscale.commands` (pyproject.toml) names a callable that adds commands to
the sub-parsers. A checkout run from its folder without `pip install -e .` has no entry points; then the
module `specscale_lab.commands` is looked up by name, when it can be found.

Every command stops the same way (`main`): Ctrl-C or SIGTERM ends it with one line on stderr and the
shell's status (130, 143), a `UsageError` with one line in argparse's form and status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import entry_points

from specscale.interrupt import Terminated, raise_terminated  # noqa: F401  (its importers take them from here too)
from specscale.usage_error import UsageError  # noqa: F401  (its importers take it from here too)

COMMAND_GROUP = "specscale.commands"
FALLBACK_COMMAND_MODULE = "specscale_lab.commands"  # its `add_commands(sub)`, the group's one entry point
USAGE_ERROR_STATUS = 2  # argparse's own status for a bad command line
MAX_COMMAND_WORDS = 2  # a command and its sub-command (`simulate throughput`)





def add_profile_prm(sub) -> None:
    p = sub.add_parser("profile-prm", help="PRM input-token throughput vs batch size; records the "
                       "lazy-verification threshold (the knee) for this model and device")
    p.add_argument("--model", default=None, help="local PRM folder (default: the bundled toy PRM)")
    p.add_argument("--out", default=None, help="JSON file (default: ~/.cache/specscale/prm-profiles/, "
                   "keyed by model and device, where the search looks)")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the JSON file)")
    p.add_argument("--batch-tokens", default=None, help="comma-separated (default: 256,512,...,8192)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--context-tokens", type=int, default=512, help="cached context each sequence extends")
    p.add_argument("--step-tokens", type=int, default=128, help="new tokens per sequence")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny batches, 2 repeats (a smoke test)")
    p.set_defaults(func=run_profile_prm)


def run_profile_prm(args) -> int:
    from specscale.verify.profile import run_profile_prm as run

    return run(args)


def add_profile_decode(sub) -> None:
    p = sub.add_parser("profile-decode", help="generator seconds per decode iteration vs rows; records the "
                       "speculative row budget for this model, device and machine")
    p.add_argument("--model", default=None, help="local generator folder (default: the bundled toy generator)")
    p.add_argument("--out", default=None, help="JSON file (default: ~/.cache/specscale/decode-profiles/, "
                   "keyed by model, device and machine, where the engine looks)")
    p.add_argument("--rows", default=None, help="comma-separated row counts (default: 1,2,4,...,128)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=run_profile_decode)


def run_profile_decode(args) -> int:
    from specscale.engine.decode_profile import run_profile_decode as run

    return run(args)


def add_kernels(sub) -> None:
    p = sub.add_parser("kernels", help="this machine's fingerprint and its cached kernel choice per linear shape "
                       "and row bucket (model/kernel_choice.py); --remeasure times them again")
    p.add_argument("--remeasure", action="store_true", help="time every cached shape again and save it "
                   "(timings taken on a busy machine go stale; SPECSCALE_REMEASURE_KERNELS=1 does it at load)")
    p.add_argument("--model", default=None, help="also load this model folder, timing the shapes it lacks "
                   "(all of them with --remeasure)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (part of the fingerprint)")
    p.set_defaults(func=run_kernels)


def run_kernels(args) -> int:
    """OMP_WAIT_POLICY and the thread count are part of the fingerprint: run it as the engine runs (the package
    defaults to PASSIVE; the benchmarks set ACTIVE)."""
    import os

    import torch

    from specscale.model.kernel_choice import REMEASURE_ENV, format_cached
    from specscale.model.kernel_timing import measured_choice, remeasure

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        from specscale.model.loader import load_model

        if args.remeasure:
            os.environ[REMEASURE_ENV] = "1"
        load_model(args.model, dtype=args.dtype, kernels="auto")
        os.environ.pop(REMEASURE_ENV, None)
    choice = measured_choice("auto")
    if args.remeasure and not args.model:
        print(f"re-measured {remeasure(choice)} timings", flush=True)
    print(format_cached(choice))
    return 0


def plugin_command_adders() -> list:
    """The callables that add plugin commands: the installed entry points, else the lab module by name."""
    found = sorted(entry_points(group=COMMAND_GROUP), key=lambda point: point.name)
    if found:
        return [point.load() for point in found]
    if importlib.util.find_spec(FALLBACK_COMMAND_MODULE.split(".")[0]) is None:
        return []
    return [importlib.import_module(FALLBACK_COMMAND_MODULE).add_commands]


def build_parser() -> argparse.ArgumentParser:
    """Imported here, not at the top: the commands' imports (torch) take seconds, and an interrupt during them
    is `main`'s to report."""
    from specscale.serve import add_serve

    parser = argparse.ArgumentParser(prog="specscale", description="PRM-guided test-time scaling server")
    sub = parser.add_subparsers(dest="command", required=True)
    add_profile_prm(sub)
    add_profile_decode(sub)
    add_kernels(sub)
    add_serve(sub)
    for add_commands in plugin_command_adders():
        add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`argv` None: the process's own command line, and the process ends with the command (`exit_as_command`)."""
    command = typed_command(sys.argv[1:] if argv is None else argv)
    status = 1  # an exception past the handlers below: Python's traceback and status
    try:
        with sigterm_interrupts():
            try:
                args = build_parser().parse_args(argv)
                status = args.func(args)
            except UsageError as error:
                print(f"{command}: error: {error}", file=sys.stderr)
                status = USAGE_ERROR_STATUS
    except KeyboardInterrupt as interrupt:  # also one that lands as the command returns
        print(f"\n{command}: {interrupted_text(interrupt)}", file=sys.stderr)
        status = interrupted_status(interrupt)
    finally:
        if argv is None:
            exit_as_command(command, status)
    return status


def typed_command(argv: list[str]) -> str:
    """`specscale simulate throughput`: the command and its sub-command as typed (the words before the
    first option; known before the parser is built, which takes seconds to import)."""
    words = argv[:MAX_COMMAND_WORDS]
    options = [i for i, word in enumerate(words) if word.startswith("-")]
    return " ".join(["specscale", *words[:options[0] if options else len(words)]])


def interrupted_text(interrupt: KeyboardInterrupt) -> str:
    """'interrupted', with how far the command got when it said (the interrupt's message, e.g. 'after 3 of
    8 cells')."""
    return " ".join(["interrupted", *map(str, interrupt.args)])


def interrupted_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process ended by the signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    number = signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT
    return 128 + number


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises `Terminated` while the block runs (on the main thread only: Python's signal handlers
    live there); the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)




# ---- after the command: the process's own exit ---------------------------------------------------------
# A command's last output (eval's report, solve's accuracy) comes a fraction of a second before the process
# ends: Python then joins threads, runs the atexit callbacks (Ray's, multiprocessing's) and tears its modules
# down (torch's alone 0.25 s here), the last part with the default signal dispositions back, where Ctrl-C
# ended the process by the signal (status -2) without a line. From the command's return on, a signal prints
# the command's one interrupt line and exits 130 / 143 (`late_signal`); the teardown itself ignores them
# (`hold_signals`, the last atexit callback), so the command's own status stands.
_exiting: dict[str, object] = {}  # the command and its status, once `main` ran as the process's command


def exit_as_command(command: str, status: int) -> None:
    """The rest of the process's life, as the command ends: a signal is the command's interrupt."""
    _exiting.update(command=command, status=status)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, late_signal)
        signal.signal(signal.SIGTERM, late_signal)


def late_signal(signum, frame) -> None:
    """Ctrl-C / SIGTERM after the command returned: its interrupt line (unless it was interrupted already and
    said so), the shell's status, and no teardown left to interrupt."""
    interrupt = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    with suppress(Exception):
        sys.stdout.flush()
    if _exiting.get("status") not in (interrupted_status(KeyboardInterrupt()), interrupted_status(Terminated())):
        with suppress(Exception):
            print(f"\n{_exiting.get('command', 'specscale')}: {interrupted_text(interrupt)}", file=sys.stderr,
                  flush=True)
    os._exit(interrupted_status(interrupt))


def hold_signals() -> None:
    """The last atexit callback (registered first): Python is about to put back the default dispositions (it
    keeps an ignored signal ignored) and tear its modules down; SIGINT and SIGTERM are ignored from here, so
    the process ends with the command's own status."""
    if _exiting and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


atexit.register(hold_signals)


if __name__ == "__main__":
    sys.exit(main())
