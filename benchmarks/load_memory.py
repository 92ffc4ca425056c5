"""Resident memory `load_model` adds, in a fresh process: VmRSS before and after, and what model/memory.py
counts (docs/BENCHMARKS.md, "Real-size models").

    python benchmarks/load_memory.py ~/.cache/specscale/random-checkpoints/qwen2.5-0.5b-random bfloat16
"""

import argparse
import gc
import time

import torch

from specscale.model.loader import load_model
from specscale.model.memory import MIB, process_resident_bytes, weight_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="local Hugging Face folder")
    parser.add_argument("dtype", choices=["float32", "bfloat16", "auto"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    before, start = process_resident_bytes(), time.perf_counter()
    model = load_model(args.model, dtype=args.dtype)
    gc.collect()
    grown = process_resident_bytes() - before
    print(f"{args.dtype}: load {time.perf_counter() - start:.1f} s, RSS +{grown / MIB:,.0f} MiB, "
          f"weights held (model/memory.py) {weight_bytes(model) / MIB:,.0f} MiB")


if __name__ == "__main__":
    main()
