"""Resident memory `load_model` adds, in a fresh process: VmRSS before and after, what model/memory.py
counts, and the checkpoint's tensor bytes in the loaded dtype (docs/bench/real-size.md, "Real-size models").
A tied checkpoint (Qwen2.5-0.5B / 1.5B) holds its embedding once: the head and the lookups share a buffer.

    python benchmarks/load_memory.py ~/.cache/specscale/random-checkpoints/qwen2.5-0.5b-random bfloat16
"""

import argparse
import gc
import time
from pathlib import Path

import torch
from safetensors import safe_open

from specscale.model.loader import load_model
from specscale.model.memory import MIB, process_resident_bytes, weight_bytes


def checkpoint_elements(folder: Path) -> int:
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            total += sum(torch.Size(handle.get_slice(name).get_shape()).numel() for name in handle.keys())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="local Hugging Face folder")
    parser.add_argument("dtype", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--kernels", default="auto", choices=["auto", "ours", "onednn", "transposed", "torch"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    before, start = process_resident_bytes(), time.perf_counter()
    model = load_model(args.model, dtype=args.dtype, kernels=args.kernels)
    gc.collect()
    grown = process_resident_bytes() - before
    held = weight_bytes(model)
    checkpoint = checkpoint_elements(Path(args.model)) * model.dtype.itemsize
    print(f"{args.dtype}: load {time.perf_counter() - start:.1f} s, RSS +{grown / MIB:,.0f} MiB, "
          f"weights held (model/memory.py) {held / MIB:,.0f} MiB, checkpoint tensors {checkpoint / MIB:,.0f} MiB "
          f"({held / checkpoint:.3f}x); linears {model.kernel_choice.describe()}")


if __name__ == "__main__":
    main()
