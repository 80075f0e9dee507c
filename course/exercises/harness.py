"""The engine exercises' harness: the learner's code run inside the real engine, and the simulator's H100.

The engine exercises (course.exercises.continuous_batching, course.exercises.speculative_decoding) run
the learner's code through the seams the engine offers: ``AdmissionRuleScheduler`` (a Scheduler
subclass), ``LearnerVerifyDrafter`` (the Drafter protocol) and ``LearnerPolicy`` (a SpecPolicy), on a
small engine (``_engine``, by default over ``tiny_course_model()``) whose greedy runs ``_generate``
checks (every block comes back). The trade-off exercises price their answers on ``H100``, the
simulator's H100 with an 8B target and a 1B draft (``h100_cost``).
"""

from __future__ import annotations

import torch

from minispec.core.attention import grouped_query_attention, write_kv
from minispec.core.batch import EmittedTokens
from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.models.llama import LlamaModel, ModelConfig
from minispec.core.model_runner import ModelRunner
from minispec.core.request import Request, SamplingParams
from minispec.core.scheduler import Scheduler
from minispec.cost.model import CostModel
from minispec.cost.hardware import load_hardware
from minispec.cost.modelspec import load_model_spec
from minispec.core.drafters import NgramDrafter
from minispec.speculation.policy import SpecPolicy
from minispec.tools.workload import load_prompts

# the trade-off exercises' device and models: the simulator's H100 with an 8B target and a 1B draft
H100 = {"hardware": "h100", "model": "llama-3-8b", "draft": "llama-3.2-1b"}


def h100_cost() -> CostModel:
    """The cost model of the trade-off exercises: H100, 8B target, 1B draft, bfloat16."""
    target = load_model_spec(H100["model"], "bfloat16", "bfloat16")
    draft = load_model_spec(H100["draft"], "bfloat16", "bfloat16")
    return CostModel(load_hardware(H100["hardware"]), target, draft)


# -- the engine exercises: the learner's code inside the real engine ---------------------------------
def tiny_course_model(seed: int = 0) -> LlamaModel:
    """A tiny random-weight Llama (vocabulary 256): the engine exercises' default model, so a check
    runs in seconds; greedy decoding of random weights loops, so n-gram lookup finds drafts."""
    return LlamaModel.random(ModelConfig.tiny(), seed=seed)


def _engine(model, tokenizer=None, spec: SpecConfig | None = None, policy=None, max_num_seqs: int = 8):
    """An engine on ``model`` (the bundled one, or ``tiny_course_model()``); a tiny model gets a
    small pool and the plain ``x @ W`` kernels the equivalence tests use."""
    if tokenizer is None:
        config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=256, block_size=4, max_model_len=256,
                              kernels="reference", scheduler=SchedulerConfig(max_num_seqs=max_num_seqs),
                              spec=spec or SpecConfig())
    else:
        config = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs), spec=spec or SpecConfig())
    return build_engine(config, model=model, tokenizer=tokenizer, policy=policy)


def _course_prompts(tokenizer, kind: str, n: int) -> list:
    """``n`` prompts for a check: the course's prompts of ``kind`` with a tokenizer, else token
    ids that repeat (so n-gram lookup finds drafts) of lengths that differ."""
    if tokenizer is not None:
        return load_prompts(kind)[:n]
    return [[(7 * i + j) % 50 + 1 for j in range(4 + 3 * i)] * 2 for i in range(n)][::-1]


def _generate(engine, prompts, max_tokens, plain: bool = False) -> list[list[int]]:
    """Greedy outputs of ``prompts`` (added at once; ``max_tokens`` an int or one per prompt) on
    ``engine``, in order; ``plain``: the requests opt out of speculation (``num_speculative_tokens``
    0), so one engine gives both runs. Every block must come back; the prefix cache is then
    emptied, so the next run computes what this one did (no hit changes its arithmetic)."""
    lengths = max_tokens if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(prompts)
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                                num_speculative_tokens=0 if plain else None))
           for p, n in zip(prompts, lengths)]
    engine.run_until_done()
    engine.block_manager.check_invariants()
    if engine.num_free_blocks != engine.block_manager.num_blocks:
        raise AssertionError("KV blocks were not all returned at the end of the run")
    engine.reset_prefix_cache()
    return [engine.requests[i].output_token_ids for i in ids]


def _first_difference(got: list[list[int]], want: list[list[int]]) -> str | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f"request {i}: output token {j} differs ({a[j:j + 1]} against plain decoding's "
                    f"{b[j:j + 1]})")
    return None


# 02: an admission rule inside the scheduler
class AdmissionRuleScheduler(Scheduler):
    """The engine's Scheduler with its admission rule (``next_waiting``) replaced by ``rule``:
    ``rule(waiting)`` gets the waiting requests (a list of Request, most urgent lane first, then
    arrival) and returns the one to admit next."""

    def __init__(self, base: Scheduler, rule):
        super().__init__(base.config, base.block_manager, base.max_model_len, base.policy)
        self.rule = rule

    def next_waiting(self) -> Request | None:
        waiting = [r for queue in self.waiting.values() for r in queue]
        return self.rule(waiting) if waiting else None


# 04: a greedy verify inside the engine, through the Drafter protocol
class LearnerVerifyDrafter(NgramDrafter):
    """The engine's n-gram drafter with its verify replaced by the learner's
    ``greedy_verify(draft, target_argmax)`` (a greedy request's drafts against the target's argmax
    at each of the k + 1 positions). Counts the verifies it answered."""

    def __init__(self, greedy_verify):
        super().__init__(1, 4)
        self.greedy_verify = greedy_verify
        self.num_verifies = 0
        self.disagreements: list[str] = []  # where the learner's answer differs from the engine's verify

    def verify(self, scheduled, target_logits):
        self.num_verifies += 1
        drafts = list(scheduled.draft_token_ids)
        emitted = [int(t) for t in self.greedy_verify(drafts, target_logits.argmax(dim=-1).tolist())]
        engines = super().verify(scheduled, target_logits).token_ids
        if emitted != engines:
            self.disagreements.append(f"drafts {drafts}: yours emitted {emitted}, the engine's verify "
                                      f"{engines}")
        return EmittedTokens(emitted, len(drafts), len(emitted) - 1)


# 04: a speculation policy inside the scheduler
class LearnerPolicy(SpecPolicy):
    """A SpecPolicy whose k for a step is the learner's ``choose_k(num_running, k)``; it records
    (requests running, k) for every step it decided."""

    name = "learner"

    def __init__(self, choose_k, k: int):
        super().__init__(k)
        self.fn = choose_k
        self.decisions: list[tuple[int, int]] = []

    def choose_k(self, decodes, num_running):
        k = int(self.fn(num_running, self.k))
        if decodes:
            self.decisions.append((num_running, k))
        return k


# 01: the K/V gather of paged attention, inside the runner
class LearnerGatherRunner(ModelRunner):
    """The engine's ModelRunner (``base``'s model, KV pool and kernels) whose paged attention reads
    each request's context through the learner's ``gather(cache, block_table)``: one layer's K or V
    pool [num_blocks, block_size, Hkv, D] and a request's block ids -> its context
    [len(block_table) * block_size, Hkv, D], in order. Counts the gathers it made."""

    def __init__(self, base: ModelRunner, gather):
        super().__init__(base.model, base.kv_cache, base.block_manager, base.device, base.kernels,
                         base.weights)
        self.gather, self.num_gathers = gather, 0

    def run_model(self, input_ids, positions, meta, **extra):
        kv = self.kv_cache

        def attend(layer: int, q, k, v):  # the engine's attend, with the learner's gather inside
            write_kv(k, v, kv.k[layer], kv.v[layer], meta.slot_mapping)
            return self.paged_attention(q, kv.k[layer], kv.v[layer], meta)
        return self.model(input_ids, positions, attend, prepared=self.prepared, **extra)

    def paged_attention(self, q, k_cache, v_cache, meta):
        """``core.attention.paged_attention`` written request by request: q [N, H, D] -> [N, H, D]."""
        out, (h, d) = torch.empty_like(q), q.shape[1:]
        for g in meta.groups:
            b, qlen = g.token_index.shape
            rows, tables = g.token_index.flatten(), g.block_tables.tolist()
            self.num_gathers += 2 * b
            kg = torch.stack([self.gather(k_cache, t) for t in tables]).transpose(1, 2)  # [B, Hkv, S, D]
            vg = torch.stack([self.gather(v_cache, t) for t in tables]).transpose(1, 2)
            qg = q.index_select(0, rows).view(b, qlen, h, d).transpose(1, 2)        # [B, H, Q, D]
            og = grouped_query_attention(qg, kg, vg, g, self.model.scale)
            out.index_copy_(0, rows, og.transpose(1, 2).reshape(b * qlen, h, d))
        return out
