"""A captured CPU step: the whole forward compiled once per bucket, as CUDA graphs capture it on a GPU.

On a CPU the eager step pays the interpreter between its kernels: per layer a dozen small ops
(RMSNorm, rotary, SiLU-mul, the residual adds, the K/V write and gather), each a Python call and
a dispatch (docs/cost_model.md, section 10, profiles it). ``torch.compile`` traces the forward
once and inductor emits one C++ function that fuses the small ops and calls the matrix products
without Python in between, as SGLang's CPU graph runner does (python/sglang/srt/model_executor/
cpu_graph_runner.py). Static shapes are what make that one trace serve many steps, so this runner
reuses the CUDA-graph runner's buckets and padding (graphs/cuda_graphs.py: one packing, one bucket
rule) and compiles one function per (B, Q) with ``dynamic=False``, the context's blocks symbolic.
- The K/V write stays out of the graph (written inside, the cache was copied whole every step to keep
  the graph functional, 1.8 s; an opaque op per layer cost 1.2 ms of Python). Each layer's context
  takes the step's K/V functionally (``context``), so attention reads what the eager step reads; the
  graph returns every layer's new K/V, and one ``index_copy_`` per cache writes them after it.
- Inductor freezing makes the weights constants of the graph, so its CPU GEMM templates (``max_autotune``,
  CPP and ATen) pack them for the bucket's rows: a copy per (B, Q), beside the eager runner's oneDNN one.
- Only decode and verify steps compile (every row needs its logits); a prompt chunk, a draft model's
  catch-up and an EAGLE head's step run eagerly, as a step no bucket serves does. A compile that
  fails falls back to the eager step with one warning, and the step's requests are served all the same.
Exactness: the compiled step fuses the same arithmetic in another order, so its logits equal the
eager step's to float32 rounding and its greedy tokens equal them but at near-ties
(tests/test_compiled_step.py checks each speculation path). What it buys and costs on a CPU, and why
it is off by default: docs/cost_model.md, section 11 (``python -m bench compare_hf --variants
fast,fast+compile`` and ``python -m bench decode_profile --compile on`` measure it).
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings

import torch

from minispec.core.attention import AttentionGroup, grouped_query_attention
from minispec.graphs.cuda_graphs import GraphModelRunner, _Graph
from minispec.models.kernels import PROJECTIONS, PreparedLinear, PreparedWeights

# inductor's settings while a bucket compiles: weights frozen into the graph, GEMMs from its CPU
# templates, and its autotuning kept off the notebook's output. They are set around the compile
# (torch.compile's ``options`` did not carry freezing through: the GEMMs stayed MKL's, a step 2.4x slower).
INDUCTOR_CONFIG = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def context_rows(slots: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Where each token's K/V sits in the rows' gathered contexts [B * S] (S = nblk * block_size):
    r * S + j * block_size + o for row r's token in its j-th block at offset o; a padding token (its
    slot in no block of its row) at B * S, a spare row. slots [N], block_tables [B, nblk] -> [N] long."""
    b, nblk = block_tables.shape
    rows = torch.arange(slots.shape[0], device=slots.device) // (slots.shape[0] // b)
    hit = block_tables[rows] == (slots // block_size).unsqueeze(1)  # [N, nblk]
    at = rows * (nblk * block_size) + hit.int().argmax(1) * block_size + slots % block_size
    return torch.where(hit.any(1), at, b * nblk * block_size)


def context(cache: torch.Tensor, block_tables: torch.Tensor, new: torch.Tensor, at: torch.Tensor):
    """One layer's context [B, Hkv, S, D] as core/attention.py gathers it after the write: the rows'
    blocks of ``cache`` with this step's ``new`` [N, Hkv, D] placed at ``at``; the cache only read."""
    b, (hkv, d) = block_tables.shape[0], cache.shape[2:]
    old = cache.index_select(0, block_tables.flatten()).view(-1, hkv, d)
    rows = torch.cat([old, old.new_zeros(1, hkv, d)]).index_copy(0, at, new)[:-1]
    return rows.view(b, -1, hkv, d).transpose(1, 2)


def compile_unavailable() -> str | None:
    """Why this machine cannot compile a CPU step (no C++ compiler on PATH), or None when it can."""
    from torch._inductor import config as inductor_config  # 0.9 s to import: only where compile is asked for

    cxx = inductor_config.cpp.cxx
    compiler = cxx[-1] if isinstance(cxx, tuple) else cxx
    if compiler is None:
        compiler = "g++"
    return None if shutil.which(compiler) else (f"torch.compile's C++ compiler {compiler!r} is not on "
                                                "PATH (install g++ or clang++)")


def traced_weights(runner) -> PreparedWeights:
    """The runner's weights as the compiled step multiplies them: oneDNN's packed copies and the
    model's own float weights become plain [in, out] tensors (inductor packs them itself); the
    low-bit formats keep their PyTorch kernels (plain tensors it traces)."""
    prepared, model = runner.prepared, runner.model
    dtype = {"bfloat16": torch.bfloat16}.get(runner.weights, model.lm_head.dtype)

    def plain(p: PreparedLinear | None, weight: torch.Tensor) -> PreparedLinear:
        if p is not None and p.kind in ("int4", "int8", "plain"):
            return p
        return PreparedLinear("plain", weight.to(dtype))

    layers = [{name: plain(prepared.layers[i][name] if prepared else None, getattr(layer, name))
               for name in PROJECTIONS} for i, layer in enumerate(model.layers)]
    return PreparedWeights(layers, plain(prepared.lm_head if prepared else None, model.lm_head),
                           weights=runner.weights)


class CompiledStepRunner(GraphModelRunner):
    """A GraphModelRunner on a CPU whose bucketed steps run one compiled function per bucket
    (see the module doc); every other step runs eagerly.

    Args: as GraphModelRunner's (``capture`` is always False here). The build checks the compiler
    first (``use_compile``). Raises: ValueError off a CPU.
    """

    def __init__(self, *args, **kwargs):
        kwargs["capture"] = False
        super().__init__(*args, **kwargs)
        if self.device.type != "cpu":
            raise ValueError(f"a compiled CPU step runs on a CPU, not {self.device.type}: on CUDA, "
                             "CUDA graphs capture the step")
        self.traced = traced_weights(self)
        # one compile per (B, Q), the context symbolic (a frozen graph holds its own weights: 0.7-1.3 GB
        # in float32); dynamo specialises a size of 1, so contexts start at 2 blocks
        self.block_buckets = [n for n in self.block_buckets if n >= 2] or self.block_buckets
        self.compiled = None  # torch.compile's wrapper of _step, made on the first bucket (one for all)
        self.compile_s: dict[tuple[int, int], float] = {}  # the first call's time per (B, Q) compiled
        self.failed: str | None = None  # why compiling stopped; later steps run eagerly
        # one trace per bucket (the same function at other shapes): let dynamo keep them all
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, 256)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4096)

    def graph_key(self, items, model_inputs: dict) -> tuple[int, int, int] | None:
        """As GraphModelRunner's, for decode and verify steps only: a step in which every run needs
        logits at every token. A prompt chunk (or a draft model's catch-up) runs eagerly: its
        length varies from request to request, and each new length would be a new compile."""
        if any(item.num_logits != len(item.token_ids) for item in items):
            return None
        return super().graph_key(items, model_inputs)

    def _step(self, input_ids, positions, slots, block_tables, mask):
        """The bucket's work as the compiler traces it: the model over the static buffers, each
        layer attending to its context with this step's K/V in place (the cache only read), then
        every row's logits. Returns (features, logits, new K [L, N, Hkv, D], new V)."""
        kv, scale, (b, n) = self.kv_cache, self.model.scale, (block_tables.shape[0], input_ids.shape[0])
        group = AttentionGroup(torch.arange(n).view(b, -1), block_tables, mask, whole_step=True)
        at, new_k, new_v = context_rows(slots, block_tables, kv.k.shape[2]), [], []

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            new_k.append(k)
            new_v.append(v)
            qg = q.view(b, n // b, *q.shape[1:]).transpose(1, 2)  # [B, H, Q, D]
            og = grouped_query_attention(qg, context(kv.k[layer], block_tables, k, at),
                                         context(kv.v[layer], block_tables, v, at), group, scale)
            return og.transpose(1, 2).reshape(q.shape)

        features = self.model(input_ids, positions, attend, prepared=self.traced)
        logits = self.model.compute_logits(features, self.traced)
        return features, logits, torch.stack(new_k), torch.stack(new_v)

    def _run(self, graph: _Graph) -> None:
        """Run the bucket's compiled step over its static buffers (compiling it on first use);
        after a failed compile, the eager padded step."""
        if self.failed:
            return super()._run(graph)
        b = graph.block_tables.shape[0]
        key = (b, graph.input_ids.shape[0] // b)
        inputs = (graph.input_ids, graph.positions, graph.slots, graph.block_tables, graph.mask)
        try:
            if key not in self.compile_s:
                start = time.perf_counter()
                from torch._inductor import config as inductor_config

                torch._dynamo.mark_dynamic(graph.block_tables, 1)
                torch._dynamo.mark_dynamic(graph.mask, 3)
                self.compiled = self.compiled or torch.compile(self._step, dynamic=False, fullgraph=True)
                # the compile happens in the first call; inductor's autotuner itself calls the deprecated
                # TypedStorage (torch 2.13), which is not the learner's to see
                with inductor_config.patch(INDUCTOR_CONFIG), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
                    features, logits, new_k, new_v = self.compiled(*inputs)
                self.compile_s[key] = time.perf_counter() - start
                if len(self.compile_s) == 1:
                    logging.getLogger("minispec").info(
                        "compile: bucket (B=%d, Q=%d) compiled in %.1f s; each new bucket "
                        "compiles once per process (docs/cost_model.md, section 11)",
                        *key, self.compile_s[key])
            else:
                features, logits, new_k, new_v = self.compiled(*inputs)
        except Exception as exc:  # the compiler's failure is not the request's: run the step eagerly
            self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            logging.getLogger("minispec").warning(
                "compile: bucket (B=%d, Q=%d) failed to compile (%s); this engine's steps run "
                "eagerly from now on", *key, self.failed)
            return super()._run(graph)
        cache_shape = self.kv_cache.k.shape
        for cache, new in ((self.kv_cache.k, new_k), (self.kv_cache.v, new_v)):  # every layer at once
            cache.view(cache_shape[0], -1, *cache_shape[3:]).index_copy_(1, graph.slots, new)
        graph.features.copy_(features)
        graph.logits.copy_(logits)
