"""A CPU stand-in for the three FlashInfer wrappers kernelbay-flashinfer drives, written from FlashInfer's
documented API (plan/run signatures, CSR page table, bottom-right causal alignment, window_left,
logits_soft_cap, k_scale/v_scale, MLA latent cache). It lets the backends' own code run on CPU;
`plugins/flashinfer/gpu_check.py` checks the same paths against the real kernels on a GPU.
"""

from __future__ import annotations

import sys
import types

import torch

PLAN_CALLS: list[tuple[str, dict]] = []


def _check_page_table(indptr, indices, last_page_len, page_size):
    for name, t in (("indptr", indptr), ("indices", indices), ("last_page_len", last_page_len)):
        assert t.dtype == torch.int32, f"FlashInfer needs int32 {name}, got {t.dtype}"
    assert int(indptr[-1]) <= indices.numel(), "indptr points past indices"
    assert bool(((last_page_len >= 1) & (last_page_len <= page_size)).all()), "1 <= last_page_len <= page_size"


def _tokens(cache, pages, kv_len, layout):
    """[kv_len, heads, dim] of one request from a 4-D page pool."""
    picked = cache[pages.long()]
    if layout == "HND":
        picked = picked.transpose(1, 2)
    return picked.reshape(-1, *picked.shape[2:])[:kv_len].float()


def _attend(q, k, v, plan, q_offset):
    """q [Q, H, D] at positions q_offset.., k/v [S, h, D]; FlashInfer's masks and soft-cap, in float32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,shd->hqs", q.float(), k) * plan["sm_scale"]
    cap = plan.get("logits_soft_cap") or 0.0
    if cap > 0:
        scores = cap * torch.tanh(scores / cap)
    q_pos = torch.arange(q.shape[0])[:, None] + q_offset
    k_pos = torch.arange(k.shape[0])[None, :]
    visible = torch.ones_like(q_pos - k_pos, dtype=torch.bool)
    if plan.get("causal", True):
        visible &= k_pos <= q_pos
    if plan.get("window_left", -1) >= 0:
        visible &= q_pos - k_pos <= plan["window_left"]
    return torch.einsum("hqs,shd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


class _PagedWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_tensor_cores=False, **_):
        assert float_workspace_buffer.dtype == torch.uint8
        self.kv_layout, self.use_tensor_cores, self.plan_args = kv_layout, use_tensor_cores, None

    def _run(self, q, paged_kv_cache, k_scale, v_scale, qo_indptr):
        k_cache, v_cache = paged_kv_cache
        a = self.plan_args
        assert q.dtype == a["q_data_type"] and k_cache.dtype == a["kv_data_type"], "dtypes differ from the plan"
        plan = {**a, "sm_scale": a["sm_scale"] * (k_scale or 1.0)}
        out = torch.empty(q.shape, dtype=torch.float32)
        for b in range(a["indptr"].numel() - 1):
            pages = a["indices"][a["indptr"][b] : a["indptr"][b + 1]]
            kv_len = (pages.numel() - 1) * a["page_size"] + int(a["last_page_len"][b])
            k, v = (_tokens(c, pages, kv_len, self.kv_layout) for c in (k_cache, v_cache))
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            out[q0:q1] = _attend(q[q0:q1], k, v, plan, kv_len - (q1 - q0))
        return (out * (v_scale or 1.0)).to(q.dtype)


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        *,
        causal=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        **_,
    ):
        _check_page_table(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size)
        self.plan_args = dict(
            qo_indptr=qo_indptr.cpu(),
            indptr=paged_kv_indptr.cpu(),
            indices=paged_kv_indices.cpu(),
            last_page_len=paged_kv_last_page_len.cpu(),
            page_size=page_size,
            causal=causal,
            sm_scale=sm_scale or head_dim_qk**-0.5,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type or q_data_type,
        )
        PLAN_CALLS.append(("prefill", self.plan_args))

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, **_):
        return self._run(q, paged_kv_cache, k_scale, v_scale, self.plan_args["qo_indptr"])


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        sm_scale=None,
        **_,
    ):
        _check_page_table(indptr, indices, last_page_len, page_size)
        self.plan_args = dict(
            indptr=indptr.cpu(),
            indices=indices.cpu(),
            last_page_len=last_page_len.cpu(),
            page_size=page_size,
            causal=True,
            sm_scale=sm_scale or head_dim**-0.5,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type or q_data_type,
        )
        PLAN_CALLS.append(("decode", self.plan_args))

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, **_):
        return self._run(q, paged_kv_cache, k_scale, v_scale, torch.arange(q.shape[0] + 1))


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer, use_cuda_graph=False, **_):
        self.plan_args = None

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len_arr,
        num_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        causal,
        sm_scale,
        q_data_type,
        kv_data_type,
        use_profiler=False,
    ):
        assert (head_dim_ckv, head_dim_kpe) == (512, 64), "FlashInfer's MLA kernel is built for ckv 512, kpe 64"
        self.plan_args = dict(
            qo_indptr=qo_indptr.cpu(),
            indptr=kv_indptr.cpu(),
            indices=kv_indices.cpu(),
            kv_lens=kv_len_arr.cpu(),
            page_size=page_size,
            causal=causal,
            sm_scale=sm_scale,
        )
        PLAN_CALLS.append(("mla", self.plan_args))

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False):
        a = self.plan_args
        result = torch.empty(q_nope.shape, dtype=torch.float32)
        for b in range(a["kv_lens"].numel()):
            pages, kv_len = a["indices"][a["indptr"][b] : a["indptr"][b + 1]].long(), int(a["kv_lens"][b])
            ckv = ckv_cache[pages].reshape(-1, ckv_cache.shape[-1])[:kv_len].float()
            kpe = kpe_cache[pages].reshape(-1, kpe_cache.shape[-1])[:kv_len].float()
            q0, q1 = int(a["qo_indptr"][b]), int(a["qo_indptr"][b + 1])
            scores = (
                torch.einsum("qhl,sl->hqs", q_nope[q0:q1].float(), ckv)
                + torch.einsum("qhr,sr->hqs", q_pe[q0:q1].float(), kpe)
            ) * a["sm_scale"]
            q_pos = torch.arange(q1 - q0)[:, None] + kv_len - (q1 - q0)
            if a["causal"]:
                scores = scores.masked_fill(torch.arange(kv_len)[None, :] > q_pos, float("-inf"))
            result[q0:q1] = torch.einsum("hqs,sl->qhl", scores.softmax(-1), ckv)
        return result.to(q_nope.dtype)


def install(monkeypatch) -> None:
    """Make `import flashinfer` (and `flashinfer.mla`) return this stand-in for one test."""
    module, mla = types.ModuleType("flashinfer"), types.ModuleType("flashinfer.mla")
    module.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    module.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    mla.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper
    module.mla = mla
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", mla)
    PLAN_CALLS.clear()
