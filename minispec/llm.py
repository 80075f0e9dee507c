"""The high-level API for notebooks: ``LLM(model).generate(prompts, sampling_params)``.

It builds an engine, queues every prompt, steps until all are done and returns the outputs in
prompt order. Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.build import build_engine
from minispec.core.engine import Engine
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import RequestOutput, SamplingParams


class LLM:
    """Load a model and generate from many prompts with continuous batching.

    Args:
        model: alias, local directory or hub name (default: the bundled SmolLM2-135M-Instruct).
        spec: "off", "ngram", "draft" or "synthetic"; k, policy, draft, alpha and
            draft_confidence_threshold, draft_topk and num_draft_tokens as in SpecConfig.
        **engine_kwargs: other EngineConfig fields (device, dtype, seed, block_size, ...),
            plus max_num_batched_tokens, max_num_seqs and enable_chunked_prefill.
    """

    def __init__(self, model: str = "smollm2-135m-instruct", spec: str = "off", k: int = 4,
                 policy: str = "always", draft: str | None = None, alpha: float = 0.6,
                 draft_confidence_threshold: float = 0.0, draft_topk: int = 1,
                 num_draft_tokens: int | None = None, **engine_kwargs):
        sched_keys = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill")
        sched = SchedulerConfig(**{k_: engine_kwargs.pop(k_) for k_ in sched_keys if k_ in engine_kwargs})
        spec_cfg = SpecConfig(method=spec, num_speculative_tokens=k, policy=policy, draft_model=draft,
                              alpha=alpha, draft_confidence_threshold=draft_confidence_threshold,
                              draft_topk=draft_topk, num_draft_tokens=num_draft_tokens)
        self.config = EngineConfig(model=model, scheduler=sched, spec=spec_cfg, **engine_kwargs)
        self._attach(build_engine(self.config))

    @classmethod
    def from_engine(cls, engine: Engine) -> "LLM":
        """An LLM over an engine already built (tests reuse loaded weights this way)."""
        llm = cls.__new__(cls)
        llm.config = engine.config
        llm._attach(engine)
        return llm

    def _attach(self, engine: Engine) -> None:
        self.engine = engine
        self.step_log = engine.add_observer(StepLog())  # every step's stats, for metrics()
        self.tokenizer = engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for one prompt or a list (text, chat messages or token ids).

        Returns: RequestOutputs in prompt order. Raises: ValueError for bad input (nothing is
        queued then), RuntimeError if a request failed.
        """
        if (isinstance(prompts, str)
                or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict))):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts: "
                             "give one, or one each")
        # check every prompt before queueing any: a refused batch leaves nothing behind
        token_ids = [self.engine.check_request(p, sp or SamplingParams()) for p, sp in zip(prompts, params)]
        ids = [self.engine.add_request(t, p) for t, p in zip(token_ids, params)]
        with tqdm(total=len(ids), disable=not use_tqdm or len(ids) < 2, desc="requests") as bar:
            done = {o.request_id: o for o in self.engine.run_until_done(bar)}
        failed = [done[i] for i in ids if done[i].error]
        if failed:
            raise RuntimeError(f"{len(failed)} request(s) failed: {failed[0].error}")
        return [done[i] for i in ids]

    def metrics(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict:
        """Aggregate metrics over every request this LLM has served."""
        reqs = list(self.engine.requests.values())
        steps = self.step_log.stats
        wall = (steps[-1].start_s + steps[-1].duration_s - steps[0].start_s) if steps else 0.0
        return summarize(reqs, wall, steps, ttft_slo_s, tpot_slo_s)
