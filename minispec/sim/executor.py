"""The simulated executor: the real engine and scheduler, a virtual clock, and roofline step times.

``build_sim_engine`` returns the same :class:`~minispec.core.engine.Engine` the real model uses, with
the shared :class:`~minispec.core.scheduler.Scheduler`, policies and metrics; only the executor
differs. ``SimExecutor.execute(batch)`` does what ``ModelExecutor.execute`` does, in shape:
1. the draft loop (a draft model's catch-up, chunked under the token budget as the real drafter's
   is, and k forwards, or nothing for n-gram / synthetic) is costed, and each request that drafts
   gets k placeholder draft tokens (so ``Batch.num_draft_proposed`` counts them);
2. the packed target forward is costed by the :class:`~minispec.cost.model.CostModel`;
3. each verify draws its accepted prefix from the acceptance model (speculation/acceptance.py, as the
   real synthetic drafter does) and emits accepted + 1 tokens,
   a completed prefill or a decode emits 1, a mid-prompt chunk 0; a draft model's progress then
   drops the rejected positions (``DraftProgress.truncate``, as the real drafter's observe does);
4. the virtual clock advances by the step's time, so every timestamp the scheduler records
   (TTFT, TPOT, ITL) is simulated time.
Invariant: no scheduling decision is made here; the executor only answers the Batch it is given.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from minispec.core.batch import EmittedTokens, StepResult
from minispec.base.config import EngineConfig
from minispec.core.engine import Engine
from minispec.guard.engine_guard import GuardedEngine
from minispec.build.pool import build_scheduler, memory_follows_use
from minispec.cost.model import CostModel, batch_items, item_sums, max_query_of
from minispec.sim.drafters import resolve_drafter
from minispec.cost.hardware import HardwareSpec, load_hardware
from minispec.cost.modelspec import ModelSpec, load_model_spec
from minispec.speculation.acceptance import FixedAlpha
from minispec.core.drafters import DraftProgress
from minispec.build.speculation import engine_policy
from minispec.base.tree_shape import canonical_tree, expanded_widths, tree_depth

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
        acceptance: an acceptance model (speculation/acceptance.py: ``FixedAlpha``, ``RouteAlpha``,
            ``TraceAcceptance``), the same kind the real synthetic drafter draws from.
        max_catch_up_tokens: a step's draft catch-up budget (``DraftProgress``; the token budget).
    """

    def __init__(self, cost_model: CostModel, clock: VirtualClock,
                 acceptance, max_catch_up_tokens: int | None = None):
        self.cost_model = cost_model
        self.clock = clock
        self.acceptance = acceptance
        # the draft model's KV, as DraftModelDrafter keeps it, its catch-up chunked under the same budget
        self.draft_progress = DraftProgress(max_catch_up_tokens)

    @property
    def vocab_size(self) -> int:
        return self.cost_model.target.vocab_size

    def execute(self, batch) -> StepResult:
        speculating = [s for s in batch.scheduled if s.num_speculative_tokens > 0]
        draft_s, drafting = self._draft(speculating) if speculating else (0.0, [])
        # 1. propose: k placeholder drafts (or a tree's nodes), as the synthetic drafter does
        for s in drafting:
            s.draft_token_ids = [DUMMY_TOKEN] * s.num_draft_tokens
            if s.is_tree:
                s.draft_parents = canonical_tree(s.num_speculative_tokens, s.draft_topk, s.num_draft_tokens)
        items = batch_items(batch)
        # 2. forward
        target_s = self.cost_model.forward_time_s(*item_sums(items), max_query=max_query_of(items))
        outputs = [self._emit(s) for s in batch.scheduled]  # 3. verify
        self.draft_progress.truncate(batch.scheduled, outputs)  # the draft keeps what the target kept
        self.clock.advance(draft_s + target_s)
        return StepResult(outputs, draft_time_s=draft_s, target_time_s=target_s)

    def _emit(self, s) -> EmittedTokens:
        if not s.samples:
            return EmittedTokens([])  # mid-prompt chunk: nothing to sample
        drafts = len(s.draft_token_ids)
        if not drafts:
            return EmittedTokens([DUMMY_TOKEN])
        if s.draft_parents is not None:  # a tree: the path the target's tokens take through it
            path = self.acceptance.draw_tree(s.request, s.draft_parents)
            return EmittedTokens([DUMMY_TOKEN] * (len(path) + 1), drafts, len(path), accepted_nodes=path,
                                 num_speculative_tokens=tree_depth(s.draft_parents))
        accepted = self.acceptance.draw(s.request, drafts)
        return EmittedTokens([DUMMY_TOKEN] * (accepted + 1), drafts, accepted)

    def _draft(self, speculating) -> tuple[float, list]:
        """The draft model's loop, with DraftModelDrafter's catch-up and rollback: the draft keeps
        only K/V the target kept at each step (``DraftProgress.truncate`` in ``execute``), runs the
        tokens it has not seen (a chunk of them when the step's catch-up budget runs out:
        ``DraftProgress.grant``; that request drafts nothing this step), then k - 1 more (a
        chain), or for a tree the up-to-topk nodes of each depth it expands, whose K/V it then
        drops. Returns (its seconds, the requests that draft): 0 and every request when drafting
        is free (n-gram, synthetic)."""
        if self.cost_model.draft is None:
            return 0.0, speculating
        progress = self.draft_progress
        drafting, pending, contexts, ks, widths = [], [], [], [], []
        for s in speculating:
            req, k = s.request, s.num_speculative_tokens
            done, m = progress.begin(req, req.num_tokens)  # as DraftModelDrafter.start
            unseen = req.num_tokens - done
            s.num_catch_up_tokens = m
            if not m:
                continue  # no budget left: it decodes plainly, as the real drafter's does
            contexts.append(done)
            pending.append(m)
            if m < unseen:  # a chunk: forward 0 only, no drafts
                ks.append(1)
                widths.append([])
                progress.count_run(req.request_id, m)
                continue
            drafting.append(s)
            ks.append(k)
            if not s.is_tree:
                widths.append([1] * (k - 1))
                progress.count_run(req.request_id, m + k - 1)
            else:
                parents = canonical_tree(k, s.draft_topk, s.num_draft_tokens)
                widths.append(expanded_widths(parents, k, s.draft_topk))
                progress.count_run(req.request_id, m)
        return self.cost_model.draft_time_s(pending, contexts, ks, widths), drafting

    def free(self, request_ids: list[str]) -> None:
        """Forget the draft model's progress for finished, aborted or preempted requests."""
        self.draft_progress.free(request_ids)


def kv_budget_bytes(hardware: HardwareSpec, target: ModelSpec, draft: ModelSpec | None,
                    memory_utilization: float = 0.9, tensor_parallel_size: int = 1) -> float:
    """Memory left for KV blocks after the weights (bytes), over all ``tensor_parallel_size``
    devices; the pool is then sized by the engine's one formula (``minispec.build.pool.kv_pool_blocks``),
    target and draft K/V together.

    Raises: ValueError when the weights alone exceed the usable memory.
    """
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization={memory_utilization}: must be in (0, 1]")
    usable = hardware.memory_bytes * memory_utilization * tensor_parallel_size
    weights = target.weight_bytes + (draft.weight_bytes if draft else 0.0)
    if weights >= usable:
        names = target.name + (f" + {draft.name}" if draft else "")
        where = f"{tensor_parallel_size} x {hardware.name}" if tensor_parallel_size > 1 else hardware.name
        raise ValueError(
            f"{names} needs {weights / 1e9:.1f} GB of weights in {target.weight_dtype} but {where} has "
            f"{usable / 1e9:.1f} GB usable ({memory_utilization:.0%} of {hardware.memory_bytes / 1e9:.0f} GB "
            "per device): use a smaller --weight-dtype (fp8, int4), bigger hardware or "
            "--tensor-parallel-size")
    return usable - weights


def build_sim_engine(config: EngineConfig | None = None, hardware: str | HardwareSpec = "h100",
                     model: str | ModelSpec | None = None, draft: str | ModelSpec | None = None,
                     acceptance=None, weight_dtype: str | None = None, kv_dtype: str | None = None,
                     draft_kv_window: int | None = None, memory_utilization: float = 0.9,
                     tokenizer=None, policy=None, tensor_parallel_size: int = 1,
                     draft_tensor_parallel_size: int | None = None) -> Engine:
    """An Engine on a virtual clock: shared scheduler and policies, SimExecutor, roofline times.

    Args:
        config: engine settings (scheduler, spec method / k / policy / alpha, block size, seed);
            ``config.model`` names the target when ``model`` is None.
        hardware: name in data/hardware/ or a HardwareSpec.
        model, draft: preset names, config paths or ModelSpecs; the draft may also be a head
            sized from the target ("eagle-head", "eagle3-head", "mtp") or a lookup drafter
            ("ngram", "suffix", free), see minispec/sim/drafters.py. The draft is costed only
            for ``spec.method == "draft"`` (n-gram and synthetic drafting are free).
        acceptance: acceptance model; None draws every position from ``config.spec.alpha``.
        weight_dtype, kv_dtype: storage dtypes (default: the hardware's default dtype).
        draft_kv_window: cap on the draft's attended context (see CostModel).
        memory_utilization: fraction of device memory for weights + KV (vLLM's default is 0.9).
        tokenizer: optional, only to turn text or chat prompts into token ids of the right length.
        policy: a SpecPolicy object to use instead of the one ``config.spec.policy`` spells
            (speculation must be on: ``config.spec.method`` other than "off").
        tensor_parallel_size: GPUs of ``hardware`` the target is split over;
            ``draft_tensor_parallel_size`` the drafter's (None: the same).
    Raises: ValueError for unknown hardware or models, weights that do not fit, a missing draft,
        or a split the hardware cannot price.
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
        draft_spec = resolve_drafter(name, target, wdtype, kv_dtype or wdtype)
    cost_model = CostModel(hw, target, draft_spec, draft_kv_window, tensor_parallel_size,
                           draft_tensor_parallel_size)
    max_len = config.max_model_len or target.max_position_embeddings
    clock = VirtualClock()
    policy = engine_policy(spec, policy, cost_model)
    kv_bytes = target.kv_bytes_per_token + (draft_spec.kv_bytes_per_token if draft_spec else 0.0)
    budget = kv_budget_bytes(hw, target, draft_spec, memory_utilization, tensor_parallel_size) \
        if config.num_kv_blocks is None else None
    # the pool evicts as the real engine's on the modelled device does, so both schedule the same batches
    scheduler = build_scheduler(config, max_len, kv_bytes, policy, kv_cache_bytes=budget,
                                max_draft_len=draft_spec.max_position_embeddings if draft_spec else None,
                                memory_follows_use=memory_follows_use(hw.device_type))
    executor = SimExecutor(cost_model, clock, acceptance or FixedAlpha(spec.alpha, seed=config.seed),
                           max_catch_up_tokens=config.scheduler.max_num_batched_tokens)
    return GuardedEngine(config, scheduler, executor, tokenizer, clock=clock, max_model_len=max_len)
