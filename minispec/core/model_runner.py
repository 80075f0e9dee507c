"""Run one packed forward of a model over a paged KV cache.

``ModelRunner.forward`` packs a step's ``ForwardItem`` runs (one per request) into N tokens,
computes each token's slot from the block tables, runs the model once, and returns the logits
rows asked for plus every token's hidden state. The target and a draft model each have a runner.
Invariant: each token's K/V is written to the slot of its position, so a later step that rewrites
a position (after a rejected draft) simply overwrites it. The runner owns the kernel choice
(models/kernels.py). Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.core.attention import AttentionMetadata, PackedRun, build_group, paged_attention, write_kv
from minispec.core.block_manager import BlockManager
from minispec.base.kv_cache import KVCache
from minispec.models.kernels import prepare_weights
from minispec.models.llama import LlamaModel
from minispec.base.tree_shape import TreeLayout


@dataclass
class ForwardItem:
    """A run of tokens for one request: ``token_ids`` start at position ``start_pos``; the last
    ``num_logits`` need logits (0 for a mid-prompt chunk). ``tree``: for a draft tree, where each
    token sits and what it attends (its tokens still go to slots ``start_pos``, ...)."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    num_logits: int
    tree: TreeLayout | None = None


@dataclass
class ForwardOutput:
    """Per item, in order: logits [num_logits, V] float32 on the runner's device, the last hidden
    states [T, E] (the model's dtype), and the features a drafter reads [T, F]: the hidden states,
    after the outputs of the runner's ``capture_layers`` if any (``LlamaModel.features``)."""

    logits: list[torch.Tensor]
    hidden: list[torch.Tensor]
    features: list[torch.Tensor]


class ModelRunner:
    """A model, its KV tensors and its block pool: runs packed forwards for lists of ForwardItems.

    Args:
        model: the model (shared, never changed here); device: where the step's tensors go.
        kv_cache, block_manager: this runner's KV tensors and their block tables.
        kernels: "reference" (plain ``x @ W``) or "fast" (oneDNN on CPU; see kernels.py).
        weights: "float32", "bfloat16", "int8" or "int4" storage of the projections and LM head
            (None: the model's dtype).
        capture_layers: layers whose outputs ``features`` also returns (an EAGLE-3 style head).
    Raises: ValueError for a kernel or weight choice this device cannot run, or a layer to
        capture that the model lacks.
    """

    def __init__(self, model: LlamaModel, kv_cache: KVCache, block_manager: BlockManager,
                 device: torch.device, kernels: str = "reference", weights: str | None = None,
                 capture_layers: tuple[int, ...] = ()):
        if any(not 0 <= i < model.cfg.num_layers for i in capture_layers):
            raise ValueError(f"capture layers {list(capture_layers)}: the model has layers "
                             f"0..{model.cfg.num_layers - 1}")
        self.capture_layers = tuple(capture_layers)
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.device = device
        self.kernels = kernels
        self.weights = weights or str(model.lm_head.dtype).removeprefix("torch.")
        self.prepared = prepare_weights(model, kernels, self.weights)

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], **model_inputs: torch.Tensor) -> ForwardOutput:
        """One packed step over ``items`` (one run per request); blocks must cover every position.
        ``model_inputs``: extra per-token inputs, packed in item order (an EAGLE head's features).
        Logits stay on the runner's device. Raises: ValueError past the model's maximum length."""
        self.prepare_step(items)
        runs, start = [], 0
        for item in items:
            runs.append(self.pack(item, start))
            start += len(item.token_ids)
        # a group pads to its longest table: grouping by context size class (2^n blocks) bounds that at 2x
        by_shape: dict[tuple[int, int], list[PackedRun]] = {}
        for run in runs:
            by_shape.setdefault((len(run.token_ids), (len(run.block_table) - 1).bit_length()), []).append(run)
        dev, dtype = self.device, self.model.embed_tokens.dtype

        def packed(per_run) -> torch.Tensor:  # [N] long: the runs' values in packing order
            return torch.tensor([v for values in per_run for v in values], dtype=torch.long, device=dev)

        bs = self.block_manager.block_size
        groups = [build_group(grp, bs, dev, dtype, start) for grp in by_shape.values()]
        extra = {name: value.to(dev) for name, value in model_inputs.items()}
        features = self.run_model(packed(r.token_ids for r in runs), packed(r.positions for r in runs),
                                  AttentionMetadata(packed(r.slots for r in runs), groups), **extra)
        hidden = features[:, -self.model.cfg.hidden_size:]
        ends = [r.start + len(r.token_ids) for r in runs]
        rows = hidden.index_select(0, packed(range(end - it.num_logits, end) for end, it in zip(ends, items)))
        logits = list(self.model.compute_logits(rows, self.prepared).split([it.num_logits for it in items]))
        sizes = [len(item.token_ids) for item in items]
        return ForwardOutput(logits, list(hidden.split(sizes)), list(features.split(sizes)))

    def pack(self, item: ForwardItem, start: int) -> PackedRun:
        """``item`` laid out as the step's rows ``start``... (each token's slot from its request's
        block table): the one packing both an eager step and a CUDA graph's replay use."""
        pos = list(range(item.start_pos, item.start_pos + len(item.token_ids)))  # the slots' positions
        return PackedRun(start, item.token_ids, pos, item.tree.positions if item.tree is not None else pos,
                         self.block_manager.slots(item.request_id, pos),
                         self.block_manager.block_tables[item.request_id], pos[-1] + 1, item.tree)

    def prepare_step(self, items: list[ForwardItem]) -> None:
        """Check positions against the model's limit (ValueError past it); zero new KV blocks."""
        limit = self.model.cfg.max_position_embeddings
        if any(item.start_pos + len(item.token_ids) > limit for item in items):
            raise ValueError(f"a position reaches the model's limit of {limit} tokens")
        self.kv_cache.ready(self.block_manager.num_blocks_touched)

    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                  **extra: torch.Tensor) -> torch.Tensor:
        """The model over a packed step whose attention inputs are ``meta``: input_ids and positions [N] long
        -> features [N, F] (see ForwardOutput); each layer writes its K/V to the cache by slot, then attends
        through the block tables. Device work only (a CUDA graph can record it)."""
        kv, scale = self.kv_cache, self.model.scale

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            write_kv(k, v, kv.k[layer], kv.v[layer], meta.slot_mapping)
            return paged_attention(q, kv.k[layer], kv.v[layer], meta, scale)

        if self.capture_layers:
            extra["capture"] = self.capture_layers
        return self.model(input_ids, positions, attend, prepared=self.prepared, **extra)
