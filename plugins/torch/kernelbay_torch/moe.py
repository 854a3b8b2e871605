"""TORCH_MOE: the reference MoE kernel in plain torch, a loop over the experts that received tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelbay.attention import ANY
from kernelbay.dtypes import MODEL_DTYPES
from kernelbay.moe import ACTIVATIONS, EXPERT_FORMATS, ExpertWeights, MoEBackend, dense_weights, gated_activation


class TorchMoEBackend(MoEBackend):
    """Readable rather than fast; stored formats (FP8 blocks, MXFP4) are dequantized once in `prepare_weights`."""

    name = "TORCH_MOE"
    dtypes = frozenset(MODEL_DTYPES)
    activations = frozenset(ACTIVATIONS)
    routings = ANY  # ids and weights arrive routed: any router's output is computed the same way
    expert_formats = frozenset(EXPERT_FORMATS)
    platforms = ANY
    bias = True

    def prepare_weights(self, weights: ExpertWeights) -> ExpertWeights:
        if self.geometry.expert_format == "dense":
            return weights
        dtype = weights.gate_up_bias.dtype if weights.gate_up_bias is not None else torch.get_default_dtype()
        return dense_weights(self.geometry, weights, dtype)

    def _experts(self, x: torch.Tensor, topk_ids, topk_weights, weights: ExpertWeights) -> torch.Tensor:
        if weights.gate_up_scale is not None:  # not prepared: dequantize on the fly (the kit calls prepare first)
            weights = self.prepare_weights(weights)
        inter = self.geometry.intermediate_size
        out = torch.zeros_like(x)
        for expert in topk_ids.unique().tolist():
            token, slot = torch.where(topk_ids == expert)
            bias = weights.gate_up_bias[expert] if weights.gate_up_bias is not None else None
            gate_up = F.linear(x[token], weights.gate_up[expert].to(x.dtype), bias)
            y = gated_activation(self.geometry, gate_up[:, :inter], gate_up[:, inter:])
            down_bias = weights.down_bias[expert] if weights.down_bias is not None else None
            y = F.linear(y, weights.down[expert].to(x.dtype), down_bias)
            out.index_add_(0, token, y * topk_weights[token, slot, None].to(x.dtype))
        return out


@dataclass(frozen=True, slots=True)
class PackedExpertWeights(ExpertWeights):
    """Each expert's gate_up / down weight in oneDNN's blocked layout (opaque mkldnn tensors); `gate_up` and `down`
    are meta tensors of the stacked shapes, so the dense copy can be released (weights held once)."""

    packed_gate_up: tuple[torch.Tensor, ...] = ()
    packed_down: tuple[torch.Tensor, ...] = ()


def onednn_packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(stacked: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # 8: the row count oneDNN tunes the blocked layout for (decode-sized; what layers/prepack.py uses)
    with torch.inference_mode():
        return tuple(torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 8) for w in stacked)


class TorchGroupedMoEBackend(TorchMoEBackend):
    """The fast CPU kernel: the (token, expert) pairs sorted by expert once, one matmul pair per active expert over
    its contiguous slice, the weighted rows summed back in one `index_add_` (no per-token or per-expert masks).

    float32 weights on CPU are repacked once, per expert, into oneDNN's blocked layout: the few-row products of an
    expert's slice run 2-3x faster than MKL's `F.linear` on them (benchmarks/moe.py); other dtypes use `F.linear`.
    `torch._grouped_mm` (CPU in torch 2.13) measured no faster than the loop of `F.linear` at 1-256 tokens."""

    name = "TORCH_GROUPED_MOE"

    def prepare_weights(self, weights: ExpertWeights) -> ExpertWeights:
        dense = super().prepare_weights(weights)
        w = dense.gate_up
        if w.dtype != torch.float32 or w.device.type != "cpu" or w.is_meta or not onednn_packing_available():
            return dense
        return PackedExpertWeights(
            torch.empty(dense.gate_up.shape, device="meta"),
            torch.empty(dense.down.shape, device="meta"),
            dense.gate_up_bias,
            dense.down_bias,
            packed_gate_up=_pack(dense.gate_up),
            packed_down=_pack(dense.down),
        )

    def _experts(self, x: torch.Tensor, topk_ids, topk_weights, weights: ExpertWeights) -> torch.Tensor:
        if weights.gate_up_scale is not None:
            weights = self.prepare_weights(weights)
        k = topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k  # the token of each sorted pair
        counts = torch.bincount(flat, minlength=self.geometry.num_experts).tolist()  # one host sync per layer
        rows = x[token]  # [T * k, H], grouped by expert
        out_rows = torch.empty_like(rows)
        apply = self._packed if isinstance(weights, PackedExpertWeights) and x.dtype == torch.float32 else self._dense
        start = 0
        for expert, n in enumerate(counts):
            if n:
                end = start + n
                out_rows[start:end] = apply(rows[start:end], expert, weights)
                start = end
        out_rows.mul_(topk_weights.reshape(-1)[order, None].to(x.dtype))
        return torch.zeros_like(x).index_add_(0, token, out_rows)

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        inter = self.geometry.intermediate_size
        return gated_activation(self.geometry, gate_up[:, :inter], gate_up[:, inter:])

    def _dense(self, rows: torch.Tensor, expert: int, weights: ExpertWeights) -> torch.Tensor:
        gate_up = F.linear(rows, weights.gate_up[expert].to(rows.dtype), _row(weights.gate_up_bias, expert))
        return F.linear(self._act(gate_up), weights.down[expert].to(rows.dtype), _row(weights.down_bias, expert))

    def _packed(self, rows: torch.Tensor, expert: int, weights: PackedExpertWeights) -> torch.Tensor:
        linear = torch.ops.mkldnn._linear_pointwise
        gate_up = linear(rows, weights.packed_gate_up[expert], _row(weights.gate_up_bias, expert), "none", [], "")
        return linear(self._act(gate_up), weights.packed_down[expert], _row(weights.down_bias, expert), "none", [], "")


def _row(bias: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return bias[expert] if bias is not None else None
