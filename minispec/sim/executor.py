"""The simulated executor: the real engine and scheduler, a virtual clock, and roofline step times.

``build_sim_engine`` returns the same :class:`~minispec.engine.Engine` the real model uses, with
the shared :class:`~minispec.scheduler.Scheduler`, policies and metrics; only the executor
differs. ``SimExecutor.execute(batch)`` does what ``ModelExecutor.execute`` does, in shape:
1. speculating requests get k dummy draft tokens (so ``Batch.num_verify_positions`` counts them);
2. the draft loop (a draft model's k forwards, or nothing for n-gram / synthetic) and the packed
   target forward are costed by the :class:`~minispec.sim.costmodel.CostModel`;
3. each verify draws its accepted prefix from the acceptance model and emits accepted + 1 tokens,
   a completed prefill or a decode emits 1, a mid-prompt chunk 0;
4. the virtual clock advances by the step's time, so every timestamp the scheduler records
   (TTFT, TPOT, ITL) is simulated time.
Invariant: no scheduling decision is made here; the executor only answers the Batch it is given.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

from minispec.config import EngineConfig
from minispec.engine import Engine, kv_pool_blocks
from minispec.executor import StepResult
from minispec.kv_cache import BlockManager
from minispec.scheduler import Scheduler, SeqOutput
from minispec.sim.acceptance import FixedAlpha
from minispec.sim.costmodel import CostModel
from minispec.sim.hardware import HardwareSpec, load_hardware
from minispec.sim.modelspec import ModelSpec, load_model_spec
from minispec.spec.policy import make_policy

DUMMY_TOKEN = 0  # simulated outputs carry no text


class VirtualClock:
    """Simulated seconds. Callable like ``time.perf_counter``; only the executor (and an idle
    Poisson workload, through ``advance_to``) moves it forward."""

    def __init__(self, start_s: float = 0.0):
        self.now_s = float(start_s)

    def __call__(self) -> float:
        return self.now_s

    def advance(self, dt_s: float) -> None:
        """Move forward by ``dt_s`` seconds. Raises ValueError for a negative step."""
        if dt_s < 0:
            raise ValueError(f"dt_s={dt_s}: a clock cannot go back")
        self.now_s += dt_s

    def advance_to(self, t_s: float) -> None:
        """Idle until time ``t_s``; a time already passed leaves the clock where it is."""
        if t_s > self.now_s:
            self.now_s = float(t_s)


class SimExecutor:
    """Executes a Batch on paper: costs it, draws acceptances, advances the virtual clock.

    Args:
        cost_model: step times for the target (and the draft model, if drafting costs anything).
        clock: the engine's VirtualClock.
        acceptance: an acceptance model (``FixedAlpha``, ``RouteAlpha``, ``TraceAcceptance``).
    """

    def __init__(self, cost_model: CostModel, clock: VirtualClock, acceptance):
        self.cost_model = cost_model
        self.clock = clock
        self.acceptance = acceptance
        self.draft_computed: dict[str, int] = {}  # tokens in the draft model's KV, per request

    @property
    def vocab_size(self) -> int:
        return self.cost_model.target.vocab_size

    def execute(self, batch) -> StepResult:
        scheduled = batch.scheduled
        speculating = [s for s in scheduled if s.num_spec_tokens > 0]
        for s in speculating:
            s.draft_token_ids = [DUMMY_TOKEN] * s.num_spec_tokens
        draft_s = self._draft_time(speculating) if speculating and self.cost_model.draft is not None else 0.0
        # one pass: the target forward's sums (see CostModel.forward_cost) and each request's output
        n = r = 0
        pairs = kv = 0.0
        outputs = []
        draw = self.acceptance.draw
        for s in scheduled:
            req = s.request
            c = req.num_computed_tokens
            drafts = len(s.draft_token_ids)
            q = s.num_new_tokens + drafts
            n += q
            pairs += q * c + q * (q + 1) * 0.5
            kv += c + q
            if c + s.num_new_tokens != req.num_tokens:
                outputs.append(SeqOutput([]))  # mid-prompt chunk: nothing to sample
                continue
            r += 1 + drafts
            if drafts:
                accepted = draw(req, drafts)
                outputs.append(SeqOutput([DUMMY_TOKEN] * (accepted + 1), drafts, accepted))
            else:
                outputs.append(SeqOutput([DUMMY_TOKEN]))
        target_s = self.cost_model.forward_time_s(n, r, pairs, kv, len(scheduled))
        self.clock.advance(draft_s + target_s)
        return StepResult(outputs, draft_time_s=draft_s, target_time_s=target_s)

    def _draft_time(self, speculating) -> float:
        """The draft model's loop, with the same catch-up and rollback as DraftModelDrafter: the
        draft keeps only K/V the target kept, then runs the tokens it has not seen."""
        pending, contexts, ks = [], [], []
        for s in speculating:
            req = s.request
            done = min(self.draft_computed.get(req.request_id, 0), req.num_computed_tokens)
            pending.append(req.num_tokens - done)
            contexts.append(done)
            ks.append(s.num_spec_tokens)
            self.draft_computed[req.request_id] = req.num_tokens + s.num_spec_tokens - 1
        return self.cost_model.draft_time_s(pending, contexts, ks)

    def free(self, request_ids: list[str]) -> None:
        """Forget the draft model's progress for finished, aborted or preempted requests."""
        for rid in request_ids:
            self.draft_computed.pop(rid, None)


def kv_blocks_for(hardware: HardwareSpec, target: ModelSpec, draft: ModelSpec | None, block_size: int,
                  memory_utilization: float = 0.9) -> int:
    """KV blocks that fit in device memory after the weights (target and draft each keep a pool
    of this many blocks, as the real engine does).

    Raises: ValueError when the weights alone exceed the usable memory.
    """
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization={memory_utilization}: must be in (0, 1]")
    usable = hardware.memory_bytes * memory_utilization
    weights = target.weight_bytes + (draft.weight_bytes if draft else 0.0)
    if weights >= usable:
        names = target.name + (f" + {draft.name}" if draft else "")
        raise ValueError(
            f"{names} needs {weights / 1e9:.1f} GB of weights in {target.weight_dtype} but {hardware.name} has "
            f"{usable / 1e9:.1f} GB usable ({memory_utilization:.0%} of {hardware.memory_bytes / 1e9:.0f} GB): "
            "use a smaller --weight-dtype (fp8, int4) or bigger hardware; multi-GPU is not modelled")
    per_token = target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0.0)
    return max(1, int((usable - weights) // (per_token * block_size)))


def build_sim_engine(config: EngineConfig | None = None, hardware: str | HardwareSpec = "h100",
                     model: str | ModelSpec | None = None, draft: str | ModelSpec | None = None,
                     acceptance=None, weight_dtype: str | None = None, kv_dtype: str | None = None,
                     draft_kv_window: int | None = None, memory_utilization: float = 0.9,
                     tokenizer=None) -> Engine:
    """An Engine on a virtual clock: shared scheduler and policies, SimExecutor, roofline times.

    Args:
        config: engine settings (scheduler, spec method / k / policy / alpha, block size, seed);
            ``config.model`` names the target when ``model`` is None.
        hardware: name in data/hardware/ or a HardwareSpec.
        model, draft: preset names, config paths or ModelSpecs. The draft is costed only for
            ``spec.method == "draft"`` (n-gram and synthetic drafting are free).
        acceptance: acceptance model; None draws every position from ``config.spec.alpha``.
        weight_dtype, kv_dtype: storage dtypes (default: the hardware's default dtype).
        draft_kv_window: cap on the draft's attended context (see CostModel).
        memory_utilization: fraction of device memory for weights + KV (vLLM's default is 0.9).
        tokenizer: optional, only to turn text or chat prompts into token ids of the right length.
    Raises: ValueError for unknown hardware or models, weights that do not fit, or a missing draft.
    """
    config = config or EngineConfig()
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    wdtype = weight_dtype or hw.default_dtype
    target = load_model_spec(model if model is not None else config.model, wdtype, kv_dtype or wdtype)
    spec = config.spec
    draft_spec = None
    if spec.enabled and spec.method == "draft":
        name = draft if draft is not None else spec.draft_model
        if name is None:
            raise ValueError("spec method 'draft' in the simulator needs a draft model: pass --draft NAME "
                             "(e.g. llama-3.2-1b)")
        draft_spec = load_model_spec(name, wdtype, kv_dtype or wdtype)
    cost_model = CostModel(hw, target, draft_spec, draft_kv_window)
    max_len = config.max_model_len or target.max_position_embeddings
    if config.num_kv_blocks is None:
        config = replace(config, num_kv_blocks=kv_blocks_for(hw, target, draft_spec, config.block_size,
                                                             memory_utilization))
    num_blocks = kv_pool_blocks(config, 1, max_len)
    clock = VirtualClock()
    policy = make_policy(spec.policy, spec.num_speculative_tokens, cost_model=cost_model) if spec.enabled else None
    max_draft_len = draft_spec.max_position_embeddings if draft_spec else None
    scheduler = Scheduler(config.scheduler, BlockManager(num_blocks, config.block_size), max_len,
                          policy=policy, max_draft_len=max_draft_len)
    executor = SimExecutor(cost_model, clock, acceptance or FixedAlpha(spec.alpha, seed=config.seed))
    return Engine(config, scheduler, executor, tokenizer, clock=clock, max_model_len=max_len)
