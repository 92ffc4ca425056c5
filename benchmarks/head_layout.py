"""The LM head's GEMM in two operand orders, weight out of the caches: why the "transposed" linear path exists.

A decode step multiplies the [rows, hidden] activations by the [vocabulary, hidden] head weight. `F.linear`
computes x·Wᵀ; `torch.mm(W, xᵀ)` computes the same product with the weight as the GEMM's row-major left
operand and returns it as [vocabulary, rows], which the "transposed" path (model/linear.py `Linear`)
turns back into [rows, vocabulary] with our tiled C++ transposition (`cpu_kernels.transpose_matrix`).
Prints, per row count, the median milliseconds of: F.linear; W·xᵀ alone; W·xᵀ plus our transposition (the
path as the engine runs it); and torch's strided copy of the transposition alone, for comparison. Before every
timed call the caches are evicted, as a decode step streams every weight from memory.

    python benchmarks/head_layout.py [--vocab 151936 --hidden 896 --rows 1 32 64 128 512 --repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specscale.model import cpu_kernels
from specscale.model.kernel_timing import evict_caches


def median_ms(call, repeats: int) -> float:
    call()  # warm-up: oneDNN's primitive for this shape
    times = []
    for _ in range(repeats):
        evict_caches()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def row_cells(weight: torch.Tensor, rows: int, repeats: int) -> list[float]:
    x = torch.randn(rows, weight.shape[1]).to(torch.bfloat16)  # [rows, h]
    product = torch.mm(weight, x.t())  # [V, rows]
    return [median_ms(lambda: F.linear(x, weight), repeats),
            median_ms(lambda: torch.mm(weight, x.t()), repeats),
            median_ms(lambda: cpu_kernels.transpose_matrix(torch.mm(weight, x.t())), repeats),
            median_ms(lambda: product.t().contiguous(), repeats)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64, 128, 512])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if not cpu_kernels.available():
        raise SystemExit("the C++ CPU kernels did not build: no transposed path to measure")
    torch.manual_seed(0)
    weight = (torch.randn(args.vocab, args.hidden) * 0.02).to(torch.bfloat16)  # [V, h]
    print(f"head [{args.vocab}, {args.hidden}] bf16, {torch.get_num_threads()} threads, ms (median of {args.repeats})")
    print("| rows | F.linear (x·Wᵀ) | W·xᵀ | W·xᵀ + our transposition | torch's transposition alone |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in args.rows:
        print(f"| {rows} | " + " | ".join(f"{cell:.1f}" for cell in row_cells(weight, rows, args.repeats)) + " |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
