"""Paged attention for one packed step: write this step's K/V into their slots, then attend.

Each request attends to its own cached context through its block table (Kwon et al. 2023, PagedAttention);
requests with the same query length and context size class share one batched SDPA call per layer (the
ModelRunner groups them), block tables and mask built once per step. A draft tree's mask is not causal
(``tree_shape.TreeLayout``; SpecInfer, Miao et al. 2024, sec. 4.2). Invariant: after ``write_kv`` every
token's slot holds its K/V, and positions past a request's context are masked, so stale K/V of rejected drafts
is never read. The model never sees the cache: the ModelRunner hands each layer an ``attend`` that calls this.
Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minispec.base.gpu_attention import attention_per_kv_head
from minispec.base.tree_shape import TreeLayout


@dataclass
class AttentionGroup:
    """Requests of one step that share a query length Q (B of them).

    token_index: [B, Q] long, where each query token sits in the packed step.
    block_tables: [B, max_blocks] long, physical blocks (padded with block 0).
    mask: [B, 1, Q, S] in the queries' dtype (S = max_blocks * block_size): 0 where query i may
        attend key j (j < context length and j <= its position), -inf elsewhere (SDPA adds it).
    whole_step: the group holds every token of the step in packing order (a step of decodes), so
        its queries and outputs are views of the step's tensors, not a gather and a scatter.
    """

    token_index: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor
    whole_step: bool = False
    # [B, 1, G Q, S]: the mask per query of a KV group (gpu_attention.py)
    grouped_mask: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    """Per-step attention inputs. slot_mapping: [N] long, the flat cache slot of each token."""

    slot_mapping: torch.Tensor
    groups: list[AttentionGroup]


@dataclass
class PackedRun:
    """One request's run in a packed step, as attention reads it (``ModelRunner.pack`` lays it out).

    start: its first row in the step; token_ids: its Q tokens; cache_pos: the Q cache positions
    their K/V go to (the causal mask counts from these); positions: their rotary positions (a
    tree's depths, else ``cache_pos``); slots: the flat cache slots of ``cache_pos``; block_table:
    the request's physical blocks; context_len: tokens in its cache once the step's K/V are
    written; tree: its TreeLayout, or None for a causal run.
    """

    start: int
    token_ids: list[int]
    cache_pos: list[int]
    positions: list[int]
    slots: list[int]
    block_table: list[int]
    context_len: int
    tree: TreeLayout | None = None


def build_group(runs: list[PackedRun], block_size: int, device: torch.device,
                dtype: torch.dtype = torch.float32, num_step_tokens: int | None = None) -> AttentionGroup:
    """Build one group's tensors from runs of equal length Q. dtype: the queries' (the mask's);
    num_step_tokens: N, tokens in the whole step, when known: a group whose rows are 0..N-1 in
    order is marked ``whole_step``."""
    max_blocks = max(len(r.block_table) for r in runs)
    tables = torch.zeros((len(runs), max_blocks), dtype=torch.long)
    for i, r in enumerate(runs):
        tables[i, : len(r.block_table)] = torch.tensor(r.block_table, dtype=torch.long)
    key_pos = torch.arange(max_blocks * block_size)                         # [S]
    q_pos = torch.tensor([r.cache_pos for r in runs], dtype=torch.long)      # [B, Q]
    ctx = torch.tensor([r.context_len for r in runs], dtype=torch.long)      # [B]
    allowed = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < ctx[:, None, None])
    for b, run in enumerate(runs):
        if run.tree is not None:  # the committed context, then each node's own ancestors
            allowed[b] = key_pos[None, :] < run.tree.prefix_len
            for i, seen in enumerate(run.tree.visible):
                allowed[b, i, seen] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    token_index = [list(range(r.start, r.start + len(r.cache_pos))) for r in runs]
    flat = [i for row in token_index for i in row]
    return AttentionGroup(token_index=torch.tensor(token_index, dtype=torch.long, device=device),
                          block_tables=tables.to(device), mask=mask[:, None].to(device),
                          whole_step=num_step_tokens == len(flat) and flat == list(range(len(flat))))


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter k, v [N, Hkv, D] into one layer's cache [num_blocks, block_size, Hkv, D] by slot."""
    num_blocks, block_size, hkv, d = k_cache.shape
    k_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, k)
    v_cache.view(num_blocks * block_size, hkv, d).index_copy_(0, slot_mapping, v)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of packed queries q [N, H, D] against the paged cache of one layer, which must
    already hold this step's K/V (:func:`write_kv`). Returns: [N, H, D], same dtype as q."""
    _, block_size, hkv, d = k_cache.shape
    h = q.shape[1]
    out = None
    for g in meta.groups:
        b, qlen = g.token_index.shape
        # gathers and the scatter go through index_select / index_copy_ on dim 0 (whole rows,
        # whole blocks): on CPU much cheaper than the general kernel behind q[token_index]
        rows = g.token_index.flatten()
        qg = q if g.whole_step else q.index_select(0, rows)
        qg = qg.view(b, qlen, h, d).transpose(1, 2)                                # [B, H, Q, D]
        blocks = g.block_tables.flatten()  # each request's blocks, gathered into one context
        kg = k_cache.index_select(0, blocks).view(b, -1, hkv, d).transpose(1, 2)  # [B, Hkv, S, D]
        vg = v_cache.index_select(0, blocks).view(b, -1, hkv, d).transpose(1, 2)
        og = grouped_query_attention(qg, kg, vg, g, scale)
        og = og.transpose(1, 2).reshape(b * qlen, h, d)
        if g.whole_step:
            return og
        if out is None:
            out = torch.empty_like(q)
        out.index_copy_(0, rows, og)
    return out if out is not None else torch.empty_like(q)  # no groups: a step without tokens


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup,
                            scale: float) -> torch.Tensor:
    """SDPA of q [B, H, Q, D] against k, v [B, Hkv, S, D] under the group's mask -> [B, H, Q, D].
    Query head h reads KV head h // G (G = H / Hkv; Ainslie et al. 2023): SDPA's ``enable_gqa``.
    A GPU's fused kernels take no mask with it: there, minispec/base/gpu_attention.py."""
    h, hkv = q.shape[1], k.shape[1]
    if q.device.type != "cpu" and h != hkv:
        return attention_per_kv_head(q, k, v, group, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask, scale=scale, enable_gqa=h != hkv)
