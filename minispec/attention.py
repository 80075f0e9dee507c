"""Paged attention for one packed step: write this step's K/V into their slots, then attend.

A step packs N tokens from B requests in different phases: a prefill chunk (many query tokens),
a decode (one), a verify (k + 1). Each request attends to its own cached context through its
block table (Kwon et al. 2023, PagedAttention). Requests with the same query length share one
batched SDPA call, so all decodes of a step cost one call per layer, not one per request. What a
group needs every layer (its block tables, its mask as the additive 0 / -inf bias SDPA adds to
the scores) is built once per step, so a layer spends its time on the cache, not on bookkeeping.
Invariant: after ``write_kv`` the slots of every token in the step hold its K/V; positions past a
request's context length are masked, so stale K/V from rejected draft tokens is never read.
A draft tree (several candidate continuations verified in one step) is a run of tokens whose
mask is not causal: each node sees the request's committed context, its ancestors and itself
(``TreeLayout``; Miao et al. 2024, SpecInfer, sec. 4.2, "tree attention"); its nodes are written
to consecutive slots in row order and rotated by their depth, not their row.
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
    mask: [B, 1, Q, S] in the queries' dtype (S = max_blocks * block_size): 0 where query i may
        attend key j (j < context length and j <= the query's position: causal), -inf elsewhere.
        SDPA adds it to the scores; a bool mask would be turned into this inside every call.
    whole_step: True when the group holds every token of the step in packing order (all requests
        share one query length, as in a step of decodes), so its queries and outputs are views
        of the step's tensors instead of a gather and a scatter.
    """

    token_index: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor
    whole_step: bool = False
    grouped_mask: torch.Tensor | None = None  # [B, 1, G Q, S]: the mask per query of a KV group (GPU)


@dataclass
class TreeLayout:
    """A run of T tokens of one request that are not a plain causal continuation (a draft tree).

    Token i of the run is written to cache position ``start_pos + i`` (its slot, in row order),
    rotated as sequence position ``positions[i]``, and attends to cache positions
    ``0..prefix_len-1`` (the committed context) plus those in ``visible[i]`` (the slots of its
    ancestors inside the tree, and its own).

    Args:
        prefix_len: context positions every token of the run sees.
        positions: [T] sequence positions (for the rotary embedding).
        visible: per token, the cache positions >= prefix_len it may attend, its own included.
    """

    prefix_len: int
    positions: list[int]
    visible: list[list[int]]

    @classmethod
    def from_parents(cls, start_pos: int, parents: list[int]) -> "TreeLayout":
        """The layout of a run starting at ``start_pos`` whose token i hangs under token
        ``parents[i]`` of the same run (-1: under the committed context, i.e. a root). Parents
        come before their children. A chain (parents i - 1) gives the causal layout.

        Raises: ValueError for a parent that is not an earlier token of the run.
        """
        depth, visible = [], []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"token {i} of a tree has parent {parent}: a parent must be -1 or an earlier token")
            depth.append(0 if parent < 0 else depth[parent] + 1)
            visible.append(([] if parent < 0 else visible[parent]) + [start_pos + i])
        return cls(start_pos, [start_pos + d for d in depth], visible)


@dataclass
class AttentionMetadata:
    """Per-step attention inputs. slot_mapping: [N] long, the flat cache slot of each token."""

    slot_mapping: torch.Tensor
    groups: list[AttentionGroup]


def build_group(token_index: list[list[int]], positions: list[list[int]], block_tables: list[list[int]],
                context_lens: list[int], block_size: int, device: torch.device,
                dtype: torch.dtype = torch.float32, num_step_tokens: int | None = None,
                trees: list[TreeLayout | None] | None = None) -> AttentionGroup:
    """Build one group's tensors from plain lists (one entry per request, all of query length Q).

    Args:
        token_index: per request, its Q indices into the packed step.
        positions: per request, the Q cache positions (slots) of its query tokens; for a causal
            run, also their positions in the sequence.
        block_tables: per request, its physical block ids.
        context_lens: per request, tokens in the cache once this step's K/V are written.
        dtype: the queries' dtype (the mask's).
        num_step_tokens: N, tokens in the whole step, when known: a group whose indices are
            0..N-1 in order is marked ``whole_step``.
        trees: per request, its TreeLayout, or None for a causal run (the default for all).
    """
    max_blocks = max(len(t) for t in block_tables)
    tables = torch.zeros((len(block_tables), max_blocks), dtype=torch.long)
    for i, t in enumerate(block_tables):
        tables[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    key_pos = torch.arange(max_blocks * block_size)                         # [S]
    q_pos = torch.tensor(positions, dtype=torch.long)                        # [B, Q]
    ctx = torch.tensor(context_lens, dtype=torch.long)                       # [B]
    allowed = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < ctx[:, None, None])
    for b, tree in enumerate(trees or ()):
        if tree is not None:  # the committed context, then each node's own ancestors
            allowed[b] = key_pos[None, :] < tree.prefix_len
            for i, seen in enumerate(tree.visible):
                allowed[b, i, seen] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    flat = [i for row in token_index for i in row]
    return AttentionGroup(
        token_index=torch.tensor(token_index, dtype=torch.long, device=device),
        block_tables=tables.to(device),
        mask=mask[:, None].to(device),
        whole_step=num_step_tokens == len(flat) and flat == list(range(len(flat))),
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
    return out


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup,
                            scale: float) -> torch.Tensor:
    """SDPA of q [B, H, Q, D] against k, v [B, Hkv, S, D] under the group's mask -> [B, H, Q, D].

    Query head h reads KV head h // G (G = H / Hkv; Ainslie et al. 2023). On a CPU, SDPA's own
    ``enable_gqa`` does that. On a GPU its fused kernels take no mask together with ``enable_gqa``,
    and the fallback copies every KV head G times in every layer; so there the G query heads of one
    KV head become G Q query rows of that head (a view when Q is 1), their mask repeated once per
    step (``grouped_mask``), and one fused call attends them all.
    """
    h, hkv = q.shape[1], k.shape[1]
    if q.device.type == "cpu" or h == hkv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=group.mask, scale=scale, enable_gqa=h != hkv)
    return attention_per_kv_head(q, k, v, group, scale)


def attention_per_kv_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: AttentionGroup,
                          scale: float) -> torch.Tensor:
    """The GPU branch of :func:`grouped_query_attention` (any device; tests run it on a CPU)."""
    b, h, qlen, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    if group.grouped_mask is None:
        group.grouped_mask = group.mask[:, :, None].expand(b, 1, g, qlen, group.mask.shape[-1]).reshape(b, 1, g * qlen, -1)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g * qlen, d), k, v, attn_mask=group.grouped_mask, scale=scale)
    return out.reshape(b, h, qlen, d)  # SDPA may hand back another layout: reshape, not view
