"""CUDA graphs: record a step's kernels once per batch shape, replay them with one launch.

On a GPU a small model's decode step is bound by launches, not by memory: the bundled model's
30 layers issue several hundred kernels per step, each a few microseconds of host work, while its
weights stream in about a tenth of a millisecond. A CUDA graph records those kernels once and
replays them with one launch (as vLLM and nano-vllm do for decode). A graph replays fixed
shapes at fixed addresses, so a step is padded to a bucket:
- B, the requests, rounds up to 1, 2, 4, 8, then a multiple of 16 (nano-vllm's buckets); the
  padding rows decode token 0 at position 0 into a pad block of their own (one block past the
  BlockManager's pool) and attend to nothing else, so they never touch a request's K/V;
- Q, the tokens per request, is the longest run of the step, up to ``max_query`` (a decode is 1,
  a verify k + 1, a draft model's catch-up 1 to k + 1); a shorter run is padded after its own
  tokens with tokens that write to the pad block and see only its first position, so its own
  rows are computed as in an eager step. A step with a prompt chunk longer than ``max_query``
  runs eagerly. A target whose features a drafter reads is built without graphs, in one place
  (minispec/build/engine.py): a graph runner refuses ``capture_layers``;
- the context every request may attend rounds up to a power of two of blocks.
A graph is recorded the first time its (B, Q, blocks) bucket is needed (or all at once,
``record_all``), into one memory pool shared by all of the runner's graphs (they replay one at a
time), writing its outputs to buffers they share too. The replayed kernels are the
eager path's kernels on padded inputs: per row the same arithmetic, but a matrix product of more
rows may round differently, so a graph step's logits equal an eager step's to rounding and its
greedy tokens equal them but at near-ties (bench/gpu/gpu_run.py counts both on a GPU).
Off a GPU (``capture=False``) the same padded buffers run eagerly: the tests check the padding
on a CPU. Taught in notebooks/01_decode_is_memory_bound.ipynb (the GPU's third clock).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minispec.core.attention import AttentionGroup, AttentionMetadata, PackedRun, build_group
from minispec.core.model_runner import ForwardItem, ForwardOutput, ModelRunner

PAD_BLOCKS = 1  # blocks a graph runner's KVCache holds past the pool: where padding rows write


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes graphs are recorded for: 1, 2, 4, 8, then multiples of 16 up to
    ``max_batch`` (nano-vllm's ``graph_bs``)."""
    return [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))


def bucket(value: int, buckets: list[int]) -> int | None:
    """The smallest bucket >= value, or None when value exceeds them all."""
    return next((b for b in buckets if b >= value), None)


@dataclass
class _Graph:
    """One recorded step: its static inputs, its outputs, and the graph (None off a GPU)."""

    input_ids: torch.Tensor     # [B * Q] long
    positions: torch.Tensor     # [B * Q] long
    slots: torch.Tensor         # [B * Q] long
    block_tables: torch.Tensor  # [B, blocks] long
    mask: torch.Tensor          # [B, 1, Q, blocks * block_size], the model's dtype
    features: torch.Tensor | None = None  # [B * Q, E] after a replay (a view of a shared buffer)
    logits: torch.Tensor | None = None    # [B * Q, V] float32 after a replay (likewise)
    graph: object = None


class GraphModelRunner(ModelRunner):
    """A ModelRunner that replays CUDA graphs for steps of equal-width runs (see the module doc)
    and runs every other step eagerly.

    Args (besides ModelRunner's):
        max_batch: the largest B recorded (bigger steps run eagerly).
        max_query: the widest Q recorded (a verify of k + 1 rows, a tree of its nodes + 1).
        capture: record and replay CUDA graphs; False runs the padded buffers eagerly (a CPU).
    The runner's KVCache must hold ``PAD_BLOCKS`` blocks past the BlockManager's pool.
    Raises: ValueError for a KVCache without the pad block, capture off CUDA, or ``capture_layers``.
    """

    def __init__(self, *args, max_batch: int = 512, max_query: int = 32, capture: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        if self.capture_layers:  # build_engine runs such a target eagerly: it decides, once
            raise ValueError(f"capture_layers={list(self.capture_layers)}: a graph runner returns no "
                             "captured layers")
        cache_blocks, pool_blocks = self.kv_cache.k.shape[1], self.block_manager.num_blocks
        if cache_blocks < pool_blocks + PAD_BLOCKS:
            raise ValueError(f"a graph runner's KVCache needs {PAD_BLOCKS} block past the pool of "
                             f"{pool_blocks}; it has {cache_blocks} blocks")
        if capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device.type}: use capture=False")
        self.pad_block = pool_blocks
        self.kv_cache.k[:, self.pad_block].zero_()
        self.kv_cache.v[:, self.pad_block].zero_()
        self.capture = capture
        self.batch_buckets = batch_buckets(max_batch)
        self.max_query = max_query
        limit = self.model.cfg.max_position_embeddings
        bs = self.block_manager.block_size
        max_blocks = -(-limit // bs)
        self.block_buckets = sorted({min(2 ** i, max_blocks) for i in range(max_blocks.bit_length() + 1)})
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self._outputs: dict[str, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_replays = 0  # steps served by a graph (the rest ran eagerly)

    def graph_key(self, items: list[ForwardItem], model_inputs: dict) -> tuple[int, int, int] | None:
        """The (B, Q, blocks) bucket that serves this step, or None when it must run eagerly."""
        if not items or model_inputs:
            return None
        q = max(len(item.token_ids) for item in items)
        if q > self.max_query:
            return None
        b = bucket(len(items), self.batch_buckets)
        tables = self.block_manager.block_tables
        blocks = bucket(max(len(tables[item.request_id]) for item in items), self.block_buckets)
        return None if b is None or blocks is None else (b, q, blocks)

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], **model_inputs: torch.Tensor) -> ForwardOutput:
        """As ModelRunner.forward; a step that fits a bucket replays its graph."""
        key = self.graph_key(items, model_inputs)
        if key is None:
            return super().forward(items, **model_inputs)
        self.prepare_step(items)
        graph = self.graphs.get(key) or self._record(key)
        self._load(graph, items, key)
        if graph.graph is not None:
            graph.graph.replay()
        else:
            self._run(graph)
        self.num_replays += 1
        q = key[1]
        logits, hidden, features = [], [], []
        e = self.model.cfg.hidden_size
        for b, item in enumerate(items):  # copies: the next replay overwrites the outputs
            end = b * q + len(item.token_ids)  # the run's own rows come first in its Q rows
            logits.append(graph.logits[end - item.num_logits: end].clone())
            features.append(graph.features[b * q: end].clone())
            hidden.append(features[-1][:, -e:])
        return ForwardOutput(logits, hidden, features)

    def _load(self, graph: _Graph, items: list[ForwardItem], key: tuple[int, int, int]) -> None:
        """Copy this step's inputs into the graph's static buffers, packed as an eager step packs
        them (``ModelRunner.pack``) and padded to the bucket; rows past the requests pad."""
        b_pad, q, num_blocks = key
        bs = self.block_manager.block_size
        pad_slot, runs = self.pad_block * bs, []
        for i, item in enumerate(items):  # a short run is padded after its tokens: token 0, to the pad slot
            run, pad = self.pack(item, i * q), q - len(item.token_ids)
            runs.append(replace(run, token_ids=run.token_ids + [0] * pad, positions=run.positions + [0] * pad,
                                cache_pos=run.cache_pos + [0] * pad,  # a pad token sees the run's position 0
                                slots=run.slots + [pad_slot] * pad,
                                block_table=run.block_table + [0] * (num_blocks - len(run.block_table))))
        for i in range(len(items), b_pad):  # padding: token 0 at position 0 of the pad block, alone
            runs.append(PackedRun(i * q, [0] * q, [0] * q, [0] * q, [pad_slot] * q,
                                  [self.pad_block] + [0] * (num_blocks - 1), context_len=1))
        group = build_group(runs, bs, torch.device("cpu"), graph.mask.dtype, b_pad * q)
        graph.input_ids.copy_(torch.tensor([t for r in runs for t in r.token_ids], dtype=torch.long))
        graph.positions.copy_(torch.tensor([p for r in runs for p in r.positions], dtype=torch.long))
        graph.slots.copy_(torch.tensor([s for r in runs for s in r.slots], dtype=torch.long))
        graph.block_tables.copy_(group.block_tables)
        graph.mask.copy_(group.mask)

    def _run(self, graph: _Graph) -> None:
        """The recorded work: the model over the static buffers, then the logits of every row."""
        b = graph.block_tables.shape[0]
        q = graph.input_ids.shape[0] // b
        token_index = torch.arange(b * q, device=self.device).view(b, q)
        meta = AttentionMetadata(graph.slots, [AttentionGroup(token_index, graph.block_tables, graph.mask,
                                                              whole_step=True)])
        features = self.run_model(graph.input_ids, graph.positions, meta)
        graph.features.copy_(features)
        graph.logits.copy_(self.model.compute_logits(features[:, -self.model.cfg.hidden_size:],
                                                     self.prepared))

    def _output(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """[rows, cols] of an output buffer all graphs share (they replay one at a time, and each
        step's outputs are copied out before the next): one buffer, grown when a bigger bucket is
        recorded, instead of a logits copy per bucket (B Q x V floats each)."""
        buf = self._outputs.get(name)
        if buf is None or buf.shape[0] < rows:
            buf = self._outputs[name] = torch.empty((rows, cols), dtype=dtype, device=self.device)
        return buf[:rows]

    @torch.inference_mode()
    def record_all(self, queries: tuple[int, ...] = (1,), max_batch: int | None = None,
                   contexts: tuple[int, int] | None = None) -> int:
        """Record now every bucket a run will need (nano-vllm records all at start-up), so that no
        timed step pays for a recording: each Q in ``queries``, every batch bucket up to
        ``max_batch`` and every block bucket for contexts (in tokens) from ``contexts[0]`` to
        ``contexts[1]``. The largest go first, so the shared buffers are allocated once.
        Returns how many graphs were recorded."""
        top = max_batch or self.batch_buckets[-1]
        bs = self.block_manager.block_size
        lo, hi = contexts or (1, self.model.cfg.max_position_embeddings)
        first, last = bucket(-(-lo // bs), self.block_buckets), bucket(-(-hi // bs), self.block_buckets)
        blocks = [n for n in self.block_buckets if first <= n <= (last or self.block_buckets[-1])]
        before = len(self.graphs)
        for q in sorted(queries, reverse=True):
            for b in sorted((x for x in self.batch_buckets if x <= top), reverse=True):
                for n in sorted(blocks, reverse=True):
                    if (b, q, n) not in self.graphs:
                        self._record((b, q, n))
        return len(self.graphs) - before

    def _record(self, key: tuple[int, int, int]) -> _Graph:
        """Allocate a bucket's static buffers and record its graph (on a GPU: two warm-up runs on
        a side stream, then the capture, as torch.cuda.graphs documents)."""
        b, q, num_blocks = key
        dev, bs = self.device, self.block_manager.block_size
        dtype = self.model.embed_tokens.dtype
        graph = _Graph(input_ids=torch.zeros(b * q, dtype=torch.long, device=dev),
                       positions=torch.zeros(b * q, dtype=torch.long, device=dev),
                       slots=torch.full((b * q,), self.pad_block * bs, dtype=torch.long, device=dev),
                       block_tables=torch.full((b, num_blocks), self.pad_block, dtype=torch.long, device=dev),
                       mask=torch.zeros((b, 1, q, num_blocks * bs), dtype=dtype, device=dev))
        graph.mask[..., 1:] = float("-inf")  # until loaded: every row sees only the pad block's first slot
        graph.features = self._output("features", b * q, self.model.cfg.hidden_size, dtype)
        graph.logits = self._output("logits", b * q, self.model.lm_head.shape[1], torch.float32)
        if self.capture:
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._run(graph)
            torch.cuda.current_stream(dev).wait_stream(stream)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph, pool=self.pool):
                self._run(graph)
            graph.graph = cuda_graph
        self.graphs[key] = graph
        return graph
