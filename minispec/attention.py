"""Paged attention for one packed step: write this step's K/V into their slots, then attend.

A step packs N tokens from B requests in different phases: a prefill chunk (many query tokens),
a decode (one), a verify (k + 1). Each request attends to its own cached context through its
block table (Kwon et al. 2023, PagedAttention). Requests with the same query length share one
batched SDPA call, so all decodes of a step cost one call per layer, not one per request.
Invariant: after ``write_kv`` the slots of every token in the step hold its K/V; positions past a
request's context length are masked, so stale K/V from rejected draft tokens is never read.
The model never sees the cache: the ModelRunner hands each layer an ``attend`` that writes and
reads it here. Taught in notebooks/00_quickstart.ipynb (and checked against dense attention in tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionGroup:
    """Requests of one step that share a query length Q (B of them).

    token_index: [B, Q] long, where each query token sits in the packed step.
    block_tables: [B, max_blocks] long, physical blocks (padded with block 0).
    mask: [B, 1, Q, S] bool, True where query i may attend key j (S = max_blocks * block_size):
        j < context length and j <= the query's position (causal).
    """

    token_index: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor


@dataclass
class AttentionMetadata:
    """Per-step attention inputs. slot_mapping: [N] long, the flat cache slot of each token."""

    slot_mapping: torch.Tensor
    groups: list[AttentionGroup]


def build_group(token_index: list[list[int]], positions: list[list[int]], block_tables: list[list[int]],
                context_lens: list[int], block_size: int, device: torch.device) -> AttentionGroup:
    """Build one group's tensors from plain lists (one entry per request, all of query length Q).

    Args:
        token_index: per request, its Q indices into the packed step.
        positions: per request, the Q positions of its query tokens in the sequence.
        block_tables: per request, its physical block ids.
        context_lens: per request, tokens in the cache once this step's K/V are written.
    """
    max_blocks = max(len(t) for t in block_tables)
    tables = torch.zeros((len(block_tables), max_blocks), dtype=torch.long)
    for i, t in enumerate(block_tables):
        tables[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    key_pos = torch.arange(max_blocks * block_size)                         # [S]
    q_pos = torch.tensor(positions, dtype=torch.long)                        # [B, Q]
    ctx = torch.tensor(context_lens, dtype=torch.long)                       # [B]
    mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < ctx[:, None, None])
    return AttentionGroup(
        token_index=torch.tensor(token_index, dtype=torch.long, device=device),
        block_tables=tables.to(device),
        mask=mask[:, None].to(device),
    )


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter k, v [N, Hkv, D] into one layer's cache [num_blocks, block_size, Hkv, D] by slot."""
    num_blocks, block_size, hkv, d = k_cache.shape
    k_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, k)
    v_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of packed queries q [N, H, D] against the paged cache of one layer.

    The cache must already hold this step's K/V (see :func:`write_kv`).
    Returns: [N, H, D], same dtype as q.
    """
    out = torch.empty_like(q)
    _, block_size, hkv, d = k_cache.shape
    h = q.shape[1]
    for g in meta.groups:
        b, qlen = g.token_index.shape
        # gathers and the scatter go through index_select / index_copy_ on dim 0 (whole rows,
        # whole blocks): on CPU much cheaper than the general kernel behind q[token_index]
        rows = g.token_index.flatten()
        qg = q.index_select(0, rows).view(b, qlen, h, d).transpose(1, 2)          # [B, H, Q, D]
        blocks = g.block_tables.flatten()  # each request's blocks, gathered into one context
        kg = k_cache.index_select(0, blocks).view(b, -1, hkv, d).transpose(1, 2)  # [B, Hkv, S, D]
        vg = v_cache.index_select(0, blocks).view(b, -1, hkv, d).transpose(1, 2)
        og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale, enable_gqa=h != hkv)
        out.index_copy_(0, rows, og.transpose(1, 2).reshape(b * qlen, h, d))
    return out
