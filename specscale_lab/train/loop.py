"""Shared training machinery: padding, length-bucketed batches, the optimiser loop with a schedule.

``train(model, batches, plan, loss_fn, log)`` runs AdamW with linear warm-up and cosine decay under bf16
autocast on CPU, clips gradients, and logs the running loss. ``batches`` yields whatever ``loss_fn``
takes; the loop knows nothing about the task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TrainPlan:
    """Optimiser settings of one training run."""

    steps: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.05
    clip: float = 1.0
    log_every: int = 100
    min_lr_ratio: float = 0.05


def lr_factor(step: int, plan: TrainPlan) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_lr_ratio``."""
    if step < plan.warmup:
        return (step + 1) / plan.warmup
    progress = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return plan.min_lr_ratio + (1 - plan.min_lr_ratio) * cosine


PAD_MULTIPLE = 32  # few distinct batch shapes: oneDNN builds kernels per shape, and shapes repeat


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    """Right-pad ``rows`` with ``value`` into one ``[len(rows), width]`` tensor, ``width`` a multiple
    of ``PAD_MULTIPLE``."""
    width = -(-max(len(r) for r in rows) // PAD_MULTIPLE) * PAD_MULTIPLE
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def batched(examples: Iterator, batch_size: int) -> Iterator[list]:
    """Cut a stream into batches of ``batch_size`` in stream order."""
    while True:
        yield [next(examples) for _ in range(batch_size)]


def bucketed(examples: Iterator, batch_size: int, key: Callable, pool: int = 16) -> Iterator[list]:
    """Group a stream into batches of similar ``key`` (length): sort ``pool`` batches' worth, then cut."""
    while True:
        block = [next(examples) for _ in range(batch_size * pool)]
        block.sort(key=key)
        batches = [block[i : i + batch_size] for i in range(0, len(block), batch_size)]
        order = torch.randperm(len(batches)).tolist()
        for i in order:
            yield batches[i]


def train(
    model: torch.nn.Module,
    batches: Iterator,
    plan: TrainPlan,
    loss_fn: Callable[[Any, Any], torch.Tensor],  # (model, batch) -> loss
    log: Callable[[str], None] = print,
    param_groups: list[dict] | None = None,
) -> list[float]:
    """Run ``plan.steps`` optimiser steps; returns the loss of every step."""
    model.train()
    groups = param_groups or [{"params": [p for p in model.parameters() if p.requires_grad]}]
    optimizer = torch.optim.AdamW(groups, lr=plan.lr, betas=(0.9, 0.98), weight_decay=plan.weight_decay)
    base_lrs = [group.get("lr", plan.lr) for group in optimizer.param_groups]
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(plan.steps):
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * lr_factor(step, plan)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clip)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % plan.log_every == 0:
            recent = sum(losses[-plan.log_every :]) / plan.log_every
            log(f"step {step + 1}/{plan.steps} loss {recent:.4f} ({time.perf_counter() - started:.0f} s)")
    model.eval()
    return losses
