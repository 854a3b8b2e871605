"""TORCH_MOE: the reference MoE kernel in plain torch, a loop over the experts that received tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelbay.attention import ANY
from kernelbay.dtypes import MODEL_DTYPES
from kernelbay.moe import ACTIVATIONS, WEIGHT_FORMATS, ExpertWeights, MoEBackend, dense_weights, gated_activation


class TorchMoEBackend(MoEBackend):
    """Readable rather than fast; stored formats (FP8 blocks, MXFP4) are dequantized once in `prepare_weights`."""

    name = "TORCH_MOE"
    dtypes = frozenset(MODEL_DTYPES)
    activations = frozenset(ACTIVATIONS)
    routings = ANY  # ids and weights arrive routed: any router's output is computed the same way
    weight_formats = frozenset(WEIGHT_FORMATS)
    platforms = ANY
    bias = True

    def prepare_weights(self, weights: ExpertWeights) -> ExpertWeights:
        if self.geometry.weight_format == "dense":
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


class TorchGroupedMoEBackend(TorchMoEBackend):
    """The fast CPU kernel: the (token, expert) pairs sorted by expert once, one matmul pair per active expert over
    its contiguous slice, the weighted rows summed back in one `index_add_` (no per-token or per-expert masks)."""

    name = "TORCH_GROUPED_MOE"

    def _experts(self, x: torch.Tensor, topk_ids, topk_weights, weights: ExpertWeights) -> torch.Tensor:
        if weights.gate_up_scale is not None:
            weights = self.prepare_weights(weights)
        inter, k = self.geometry.intermediate_size, topk_ids.shape[1]
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k  # the token of each sorted pair
        counts = torch.bincount(flat, minlength=self.geometry.num_experts).tolist()  # one host sync per layer
        rows = x[token]  # [T * k, H], grouped by expert
        out_rows = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                end = start + n
                out_rows[start:end] = self._expert(rows[start:end], expert, weights, inter)
                start = end
        out_rows.mul_(topk_weights.reshape(-1)[order, None].to(x.dtype))
        return torch.zeros_like(x).index_add_(0, token, out_rows)

    def _expert(self, rows: torch.Tensor, expert: int, weights: ExpertWeights, inter: int) -> torch.Tensor:
        bias = weights.gate_up_bias[expert] if weights.gate_up_bias is not None else None
        gate_up = F.linear(rows, weights.gate_up[expert], bias)
        y = gated_activation(self.geometry, gate_up[:, :inter], gate_up[:, inter:])
        down_bias = weights.down_bias[expert] if weights.down_bias is not None else None
        return F.linear(y, weights.down[expert], down_bias)
