"""Grouped-query attention on a GPU: the query heads of one KV head as extra query rows.

In grouped-query attention (Ainslie et al. 2023) query head h reads KV head h // G, G = H / Hkv.
On a CPU, SDPA's own ``enable_gqa`` does that (minispec/core/attention.py). On a GPU its fused kernels
take no mask together with ``enable_gqa``, and the fallback copies every KV head G times in every
layer; so here the G query heads of one KV head become G Q query rows of that head (a view when
Q is 1), their mask repeated once per step (``AttentionGroup.grouped_mask``), and one fused call
attends them all. Invariant: the result equals SDPA with ``enable_gqa`` (tests run it on a CPU).
Read after the core: no notebook teaches it (bench/gpu/gpu_run.py runs it on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_per_kv_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          group, scale: float) -> torch.Tensor:
    """SDPA of q [B, H, Q, D] against k, v [B, Hkv, S, D] under ``group``'s mask (an
    ``attention.AttentionGroup``, whose ``grouped_mask`` [B, 1, G Q, S] is filled on first use)
    -> [B, H, Q, D], in the queries' dtype. Any device."""
    b, h, qlen, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    if group.grouped_mask is None:
        group.grouped_mask = (group.mask[:, :, None].expand(b, 1, g, qlen, group.mask.shape[-1])
                              .reshape(b, 1, g * qlen, -1))
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g * qlen, d), k, v,
                                         attn_mask=group.grouped_mask, scale=scale)
    return out.reshape(b, h, qlen, d)  # SDPA may hand back another layout: reshape, not view
