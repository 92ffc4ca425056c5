"""A cProfile of one bench run (`bench characterize`, part 4): self time grouped by package, and the
top functions, with its Markdown table."""

from __future__ import annotations

import cProfile
import pstats
from collections import defaultdict

from specscale_lab.bench.arguments import search_settings
from specscale_lab.bench.outputs import markdown_table
from specscale_lab.bench.runs import fresh_runtime, progress_bar, run_batch, search_requests

TOP_FUNCTIONS = 15


def profile_run(testbed, args, problems) -> dict:
    """cProfile of one run of the profile variant: self time by package and the top functions."""
    requests = search_requests(testbed, problems, args.profile_variant, args.seed, tag="profile ",
                               **search_settings(args, max(args.beam_sizes)))
    runtime = fresh_runtime(testbed, args.max_concurrency)
    profiler = cProfile.Profile()
    with progress_bar(len(requests), f"profile {args.profile_variant}") as bar:
        profiler.enable()
        run_batch(runtime, requests, bar)
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # the per-function table pstats documents but does not type
    total = sum(entry[2] for entry in stats.values())
    by_area: dict[str, float] = defaultdict(float)
    for (filename, _, function), entry in stats.items():
        by_area[area_of(filename, function)] += entry[2]
    top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:TOP_FUNCTIONS]
    return {
        "variant": args.profile_variant,
        "total_s": total,
        "self_time_share_by_area": {k: v / total for k, v in sorted(by_area.items(), key=lambda kv: -kv[1])},
        "top_functions": [{"function": describe(key), "calls": entry[1], "self_s": entry[2], "cumulative_s": entry[3]}
                          for key, entry in top],
    }


def area_of(filename: str, function: str) -> str:
    """specscale.<package> for our code, "torch ops" for torch built-ins, else "python / other"."""
    if "/specscale/" in filename:
        package = filename.split("/specscale/")[-1].split("/")[0].removesuffix(".py")
        return f"specscale.{package}"
    if "specscale_cpu_kernels" in function:
        return "specscale.model (C++ CPU kernels)"
    if "torch" in filename or "torch" in function:
        return "torch"
    if "tokenizers" in filename or "tokenizers" in function:
        return "tokenizers"
    return "python / other"


def describe(key: tuple) -> str:
    filename, line, function = key
    if filename == "~":
        return function
    short = filename.split("/specscale/")[-1] if "/specscale/" in filename else filename.split("/")[-1]
    return f"{short}:{line} {function}"


def profile_report(profile: dict) -> str:
    shares = profile["self_time_share_by_area"].items()
    areas = markdown_table(["area", "self time %"], [[area, 100 * share] for area, share in shares])
    top = markdown_table(["function", "calls", "self s", "cumulative s"],
                         [[f["function"], f["calls"], f["self_s"], f["cumulative_s"]]
                          for f in profile["top_functions"]])
    return (f"\n## Profile of one {profile['variant']} run ({profile['total_s']:.1f} s of self time under cProfile)\n\n"
            + areas + "\n" + top)
