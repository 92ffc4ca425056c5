"""What every `specscale bench` sub-command (and `specscale simulate`, `eval`, `trace`) takes from its command
line: the workload, the models, `--out` and `--quick` (`add_common_arguments`), the simulated device
(`add_simulation_arguments`), the mode's defaults for what a user left unset (`apply_mode_defaults`) and the
search flags a user gave, as preset overrides (`given_search_flags`, `search_settings`): a flag left unset
keeps the preset's own value."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from specscale.config import KERNEL_MODES
from specscale.costmodel.hardware import bundled_hardware
from specscale.costmodel.model_profile import bundled_models
from specscale.pipeline import PipelineConfig
from specscale.search.presets import split_variants
from specscale.sim.simulation import SimulationConfig
from specscale.usage_error import UsageError
from specscale.vllm_backend.selection import add_vllm_selection_arguments
from specscale_lab.calibration.workload_choice import DATASET_CHOICES
from specscale_lab.cli_checks import check_sweep_settings

LADDER = ("beam", "beam+cd", "beam+cd+lv", "specscale-nospec", "naive-spec", "fasttts", "fasttts-xb", "ep-strict",
          "ep", "ep+cd", "specscale")
DEFAULT_CONCURRENCY = 32  # the evaluation's load: at most 32 requests in flight
SIMULATED_REPEATS = 1  # a simulation is deterministic under its seed: a repeat would replay the same run
SWEEP_LV_PRESET = "specscale"  # what sweep-lv sweeps
SIMULATOR = "sim"  # the --backend of a simulation
VLLM = "vllm"  # the --backend of the real models on vLLM's engine


def bench_backend(text: str) -> str:
    """bench's --backend: `engine` is solve's, serve's and eval's name for `real` (the checkpoints on our engine)."""
    return "real" if text == "engine" else text
KV_POOLS = "the KV pools come from --hardware's memory and --prm-kv-share"
PRM_KNEE = "the simulated PRM's LV threshold is its knee on the cost model"
REAL_HARDWARE_OPTIONS = {  # what `specscale simulate` refuses, and why
    "--device": "the simulated device is --hardware", "--kernels": "the simulator runs no kernels",
    "--dtype": "the simulated models' dtype is their profile's", "--kv-gb": KV_POOLS, "--prm-kv-gb": KV_POOLS,
    "--profile-prm": PRM_KNEE, "--no-profile-prm": PRM_KNEE,
}
SWITCHES = frozenset({"--profile-prm", "--no-profile-prm"})


class SimulationParser(argparse.ArgumentParser):
    """The parser of a `specscale simulate` sub-command (`add_subparsers(parser_class=SimulationParser)`):
    `add_common_arguments` gives it only what a simulation reads, none of the real hardware's options
    (`--device`, `--kernels`, `--dtype`, the KV pools in GB, `--profile-prm`, `--backend`)."""


def simulates(parser) -> bool:
    return isinstance(parser, SimulationParser)


class RealHardwareOption(argparse.Action):
    """An option of real hardware given to `specscale simulate`: refused in one line (a `UsageError`), not
    ignored. Hidden from `-h`."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(f"{option_string}: not a simulation setting ({REAL_HARDWARE_OPTIONS[option_string]}); "
                         "`specscale bench` runs real models")


class SimulatorBackend(argparse.Action):
    """`--backend sim`, which the run records of `specscale simulate` name, is accepted (it is the only one);
    any other backend is refused in one line. Hidden from `-h`."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values != SIMULATOR:
            raise UsageError(f"--backend {values}: `specscale simulate` runs the simulator only; "
                             "`specscale bench` runs real models")
        setattr(namespace, self.dest, values)


def add_refused_options(parser) -> None:
    """On a `SimulationParser`: the real hardware's options, each refused in one line if given."""
    for option in REAL_HARDWARE_OPTIONS:
        parser.add_argument(option, action=RealHardwareOption, nargs=0 if option in SWITCHES else None,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--backend", action=SimulatorBackend, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_common_arguments(parser, variants: bool = True, problems: bool = True, load_sweep: bool = False) -> None:
    """Options every sub-command takes (--variants and --problems where it has them). Those left at
    None are filled by `apply_mode_defaults`. load_sweep: `--max-concurrency` (and `--problems`) also take
    comma-separated levels, parsed as lists (bench throughput's load sweep; one value stays an int); elsewhere one
    integer each. A count that is not an integer >= 1 is refused in one line naming its flag (`UsageError`, exit 2)."""
    parser.add_argument("--out", required=True, help="folder for raw.json, summary.json, <name>.md, <name>.png")
    parser.add_argument("--quick", action="store_true", help="a small workload that finishes in under 2 minutes")
    add_model_arguments(parser)
    if not simulates(parser):
        parser.add_argument("--device", default="cpu", help="cpu or cuda (docs/gpu.md)")
    parser.add_argument("--repeats", type=positive_int("--repeats"), default=None, help="repeats; the median is reported")
    parser.add_argument("--beam-sizes", type=int_list, default=None, help="comma-separated beam sizes N")
    parser.add_argument("--beam-width", type=int, default=None, help="children per retained path M (default: the preset's)")
    parser.add_argument("--max-rounds", type=int, default=None, help="rounds per search (SearchConfig's default: 40)")
    if load_sweep:
        parser.add_argument("--max-concurrency", type=positive_int_or_list("--max-concurrency"), default=None,
                            help=f"requests in flight at most (default {DEFAULT_CONCURRENCY}); comma-separated levels "
                                 "(e.g. 1,2,4,8,32) run the ladder at each and write one table across them")
    else:
        parser.add_argument("--max-concurrency", type=positive_int("--max-concurrency"), default=None,
                            help=f"requests in flight at most (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--seed", type=int, default=0, help="first sampling seed")
    parser.add_argument("--filter-duplicates", action="store_true", default=None,
                        help="identical paths compete as one in selection (search-and-learn's option; off in the "
                             "paper's ladder)")
    if problems:
        if load_sweep:
            parser.add_argument("--problems", type=positive_int_or_list("--problems"), default=None,
                                help=problems_help(parser) + "; one count for every --max-concurrency level, or one "
                                                             "per level (e.g. 16,16,32,64,64)")
        else:
            parser.add_argument("--problems", type=positive_int("--problems"), default=None, help=problems_help(parser))
    if variants:
        parser.add_argument("--variants", "--presets", dest="variants", type=split_variants, default=None,
                            help="comma-separated presets, each optionally with SearchConfig fields changed: "
                                 "preset[field=value,...] (e.g. specscale[lv_sibling_trigger=false])")
    add_simulation_arguments(parser)


def problems_help(parser) -> str:
    if simulates(parser):
        return "simulated problems per run (drawn from the --dataset workload)"
    return "problems per run (the toy task's test problems; with --backend sim, simulated ones)"


def add_simulation_arguments(parser, dataset_help: str = "workload preset (default: toy for the toy generator, "
                                                         "else math500)") -> argparse.Action:
    """`--backend sim` (what `specscale simulate` sets): the simulated device and workload
    (docs/simulator.md). --generator / --prm then name bundled model shapes or folders with a config.json.
    Returns the `--dataset` option (`specscale trace` gives it a former name)."""
    if simulates(parser):
        group = parser.add_argument_group("simulation")
        add_refused_options(parser)
    else:
        group = parser.add_argument_group("simulation (--backend sim, or `specscale simulate`)")
        group.add_argument("--backend", type=bench_backend, choices=("real", SIMULATOR, VLLM), default="real",
                           help="real (or engine, as solve / serve / eval call it): the checkpoints on this machine, "
                                "on our engine; sim: the simulator on a "
                                "virtual clock; vllm: the checkpoints on vLLM's engine (optional: docs/gpu.md; "
                                "--generator-backend, --verifier-backend, --vllm-arg as `specscale solve` takes them)")
        add_vllm_selection_arguments(parser)
    group.add_argument("--hardware", default="cpu",
                       help=f"bundled hardware profile ({', '.join(bundled_hardware())}) or a profile JSON path")
    dataset = group.add_argument("--dataset", choices=DATASET_CHOICES, default=None, help=dataset_help)
    group.add_argument("--workload", default=None,
                       help="a trace (.jsonl, `specscale trace`) fitted onto the preset, or a workload JSON")
    group.add_argument("--prm-kv-share", type=float, default=SimulationConfig.prm_kv_share,
                       help="share of the KV memory left after the weights that goes to the PRM")
    group.add_argument("--perfect-share", type=float, default=None,
                       help="share of sound steps the simulated PRM scores exactly 1.0 (default: the preset's)")
    return dataset


def add_model_arguments(parser) -> None:
    """The models and how they are served: what `open_pipeline` reads (a simulation reads the models' names,
    --threads and the device overrides only)."""
    add_model_names(parser)
    if not simulates(parser):
        add_serving_arguments(parser)
    add_device_overrides(parser)


def add_model_names(parser) -> None:
    if simulates(parser):
        shapes = f"a bundled model shape ({', '.join(bundled_models())}) or a model folder with a config.json"
        parser.add_argument("--generator", help=f"generator: {shapes}")
        parser.add_argument("--prm", help="PRM: a bundled model shape or a model folder with a config.json")
    else:
        parser.add_argument("--generator", default=PipelineConfig.generator,
                            help=f"generator folder (default: toy); simulated: also a bundled shape ({', '.join(bundled_models())})")
        parser.add_argument("--prm", default=PipelineConfig.prm,
                            help="PRM folder (default: the bundled toy PRM); simulated: also a bundled shape")
    threads = "1, a simulation's tensors are tiny" if simulates(parser) else "torch's choice"
    parser.add_argument("--threads", type=int, default=None, help=f"torch CPU threads (default: {threads})")


def add_serving_arguments(parser) -> None:
    """How real models are served (a simulation reads none of these)."""
    parser.add_argument("--dtype", default="auto", help="model dtype for both models (default: the engine's)")
    parser.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / transposed / torch")
    parser.add_argument("--kv-gb", type=float, default=PipelineConfig.generator_kv_gb, help="generator KV pool, GB")
    parser.add_argument("--prm-kv-gb", type=float, default=PipelineConfig.prm_kv_gb, help="PRM KV pool, GB")
    parser.add_argument("--profile-prm", action=argparse.BooleanOptionalAction, default=True,
                        help="profile a PRM never profiled on this device at start (default); --no-profile-prm: "
                             "take the cost model's knee instead")


def add_device_overrides(parser) -> None:
    """The device properties a user may set instead of the resolver (device_resolver.py)."""
    parser.add_argument("--spare-rows", type=int, default=None,
                        help="speculative rows only fill an iteration up to this many rows (default: the device's budget on its "
                             "cost model, costmodel/row_budget.py; no cap on a device without one)")
    parser.add_argument("--lv-threshold", type=int, default=None, help=lv_threshold_help(parser))


def lv_threshold_help(parser) -> str:
    if simulates(parser):
        return "lazy-verification threshold in PRM tokens (default: the simulated PRM's knee on the hardware's cost model)"
    return ("lazy-verification threshold in PRM tokens (default: the PRM's profile on this device, measured at the "
            "first start; else the cost model's knee, else 2048)")


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse type for a count: an integer >= 1, else a `UsageError` naming `flag` (one line, exit 2)."""
    def parse(text: str) -> int:
        return positive_count(flag, text, text)
    return parse


def positive_int_or_list(flag: str) -> Callable[[str], int | list[int]]:
    """An argparse type for one count (`8`: an int, as `positive_int` parses it, so a recorded single-level command
    parses back as it always did) or comma-separated ones (`1,2,4,8,32`: a list), each an integer >= 1."""
    def parse(text: str) -> int | list[int]:
        parts = [part.strip() for part in text.split(",")]
        if any(not part for part in parts):
            raise UsageError(f"{flag} {text}: expected integers >= 1, comma-separated (e.g. 1,2,4,8,32)")
        counts = [positive_count(flag, text, part) for part in parts]
        return counts[0] if len(counts) == 1 else counts
    return parse


def positive_count(flag: str, text: str, part: str) -> int:
    try:
        value = int(part)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{flag} {text}: expected an integer >= 1, got {part!r}")
    return value


def float_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def apply_mode_defaults(args, full: dict, quick: dict) -> None:
    """Options left at None take the sub-command's quick or full default; then every search the run will make
    is checked by SearchConfig's rules, a bad one failing in one line before anything loads."""
    defaults = {"max_concurrency": DEFAULT_CONCURRENCY, **(quick if args.quick else full)}
    if getattr(args, "backend", "real") == "sim":
        defaults["repeats"] = SIMULATED_REPEATS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    check_sweep_settings(swept_variants(args), swept_beam_sizes(args), given_search_flags(args))


def swept_variants(args) -> list[str]:
    """The presets the run compares (sweep-lv has no --variants: it runs specscale beside its reference)."""
    return getattr(args, "variants", None) or [SWEEP_LV_PRESET]


def swept_beam_sizes(args) -> list[int]:
    """--beam-sizes, and scaling's --concurrency-beam-size."""
    concurrency_beam_size = getattr(args, "concurrency_beam_size", None)
    return [*args.beam_sizes, *([concurrency_beam_size] if concurrency_beam_size is not None else [])]


SEARCH_FLAGS = ("beam_size", "beam_width", "max_rounds", "filter_duplicates")  # SearchConfig fields, by flag


def given_search_flags(args) -> dict:
    """The search flags the user gave (or the mode's defaults filled), as preset overrides; a flag left unset
    (None) is left out, so the preset's own value stands (best-of-n's one round, a preset's beam width)."""
    return {name: getattr(args, name) for name in SEARCH_FLAGS if getattr(args, name, None) is not None}


def search_settings(args, beam_size: int) -> dict:
    """The search settings of one cell of a sub-command's beam-size sweep, as preset overrides."""
    return {**given_search_flags(args), "beam_size": beam_size}
