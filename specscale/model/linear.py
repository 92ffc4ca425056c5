"""Linear: a linear layer on the path the kernel choice measured fastest for its shape (model/kernel_choice.py),
its weight held once in that path's layout; TiedEmbedding: a tied model's embedding lookup served from its
LM head's one weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specscale.model import cpu_kernels, row_padding
from specscale.model.kernel_choice import LinearShape
from specscale.model.machine import MachineFingerprint

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


class Linear(nn.Linear):
    """nn.Linear that runs one of four paths (model/kernel_choice.py picks one per weight by measurement):

    - "ours": our bf16 kernel on a weight packed for it once (`packed_bf16`, model/cpu_kernels.py; bf16, even
      K, AVX512-BF16 CPUs): at decode sizes it streams the weights from memory while it multiplies, which
      oneDNN does not (docs/bench/real-size.md);
    - "onednn": oneDNN's prepacked matmul (`packed`; fp32, and bf16 where oneDNN has bf16 kernels), on
      whatever ISA oneDNN dispatches to (AMX on the Intel CPUs that have it: there it is several times
      faster than ours);
    - "transposed": (W x^T)^T on the plain weight, torch.mm with the weight as the row-major left operand and
      the [out, rows] product transposed by our C++ kernel (`cpu_kernels.transpose_matrix`): on the Xeon with
      AMX the 151,936-row head at 32 rows streams at ~20 GB/s this way against ~13 GB/s for F.linear's
      x W^T (docs/bench/real-size.md); in bf16 a row's result is the same in any batch;
    - "torch": F.linear on the plain weight.

    Whichever path, one copy of the weight stays: `prepack` drops the plain weight for the two packed
    layouts (unless another module still shares it). A tied LM head can take "ours" or "torch" only, whose
    layouts the embedding lookup can read (`rows`), "transposed" or "torch" (the plain weight), so the vocabulary
    table is held once (TiedEmbedding).
    """

    packed: torch.Tensor | None = None  # oneDNN's opaque prepacked weight
    packed_bf16: torch.Tensor | None = None  # [ceil(out / 48), in / 2, 48, 2] for cpu_kernels.bf16_linear
    path: str = "torch"
    pad_rows: bool = False  # its input rows padded to a few sizes (model/row_padding.py: oneDNN's cache)

    @property
    def shape(self) -> LinearShape:
        dtype = str(self.weight.dtype).removeprefix("torch.")
        return LinearShape(self.out_features, self.in_features, dtype, self.bias is not None)

    def paths(self, tied: bool = False) -> tuple[str, ...]:
        """The paths that can run this (still plain) weight here, in LINEAR_PATHS order; tied: it is also an
        embedding table, which oneDNN's opaque layout cannot serve."""
        weight = self.weight
        ours = weight.dtype == torch.bfloat16 and self.in_features % 2 == 0 and cpu_kernels.has_bf16_linear()
        onednn = not tied and can_prepack(weight.device, weight.dtype)
        transposed = weight.device.type == "cpu" and weight.element_size() in (2, 4) and cpu_kernels.available()
        candidates = (("ours", ours), ("onednn", onednn), ("transposed", transposed), ("torch", True))
        return tuple(p for p, can in candidates if can)

    def prepack(self, path: str, batch_size_hint: int = 64) -> None:
        """Lay the weight out for `path` (one of self.paths()) once; the plain copy goes unless path is torch."""
        weight = self.weight.detach()
        if path == "ours":
            self.packed_bf16 = cpu_kernels.pack_bf16_linear(weight)
        elif path == "onednn":
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size=batch_size_hint)
        if path not in ("transposed", "torch"):
            self.weight = None  # frees the plain copy unless a tied module still holds it
        self.path = path
        self.pad_rows = row_padding.pads_rows(path, weight.dtype, weight.device)

    @property
    def is_prepacked(self) -> bool:
        return self.packed is not None or self.packed_bf16 is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] -> [T, out]
        if self.packed_bf16 is not None:
            return cpu_kernels.bf16_linear(x, self.packed_bf16, self.out_features, self.bias)
        if self.pad_rows and (padded := row_padding.pad_rows(x)) is not x:
            return self.forward(padded)[: x.shape[0]]  # a bucket size pads to itself: one level
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.path == "transposed" and x.dim() == 2:
            return self._transposed(x)
        return F.linear(x, self.weight, self.bias)

    def _transposed(self, x: torch.Tensor) -> torch.Tensor:  # x [T, in] -> [T, out]
        """(W x^T)^T: the weight streams as the GEMM's left operand; one rounding, as F.linear."""
        xt = x.t()  # [in, T]
        if self.bias is None:
            product = torch.mm(self.weight, xt)  # [out, T]
        else:
            product = torch.addmm(self.bias[:, None], self.weight, xt)  # [out, T]: bias + W x^T
        return cpu_kernels.transpose_matrix(product)  # [T, out]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> weight rows [T, in], read from whichever layout holds the weight ("ours" or "torch")."""
        if self.packed_bf16 is not None:  # packed[b, p, c, :] = W[b * columns + c, 2p : 2p + 2], one 32-bit word
            _, pairs, columns, _ = self.packed_bf16.shape
            words = self.packed_bf16.view(torch.int32).view(-1)  # [blocks * pairs * columns]
            first = (ids // columns) * (pairs * columns) + ids % columns  # [T] word of (row, pair 0)
            index = first[:, None] + torch.arange(pairs, device=ids.device)[None, :] * columns  # [T, pairs]
            rows = words.index_select(0, index.view(-1))  # a flat index_select: ~15x faster than words[index]
            return rows.view(torch.bfloat16).view(ids.shape[0], self.in_features)  # [T, in]
        return F.embedding(ids, self.weight)


class TiedEmbedding(nn.Module):
    """The embedding lookup of a tied model, served from its LM head's one weight (Linear.rows)."""

    def __init__(self, head: Linear):
        super().__init__()
        self.head = head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, h]
        return self.head.rows(ids)


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN's prepacked path applies: fp32 or bf16 on a CPU whose torch build has oneDNN."""
    if not (device.type == "cpu" and dtype in PACKABLE_DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    # oneDNN's bf16 reorder needs AVX-512 (BW/VL/DQ), AMX or AVX-NE-CONVERT; an AVX2-only CPU (or one forced
    # to run as one, model/machine.py) keeps F.linear
    machine = MachineFingerprint.current()
    bf16_isa = all(machine.has(f) for f in ("avx512bw", "avx512vl", "avx512dq")) or machine.has("amx_bf16") \
        or machine.has("avx_ne_convert")
    return dtype != torch.bfloat16 or (bf16_isa and torch.ops.mkldnn._is_mkldnn_bf16_supported())
