"""A failure stays with the request it belongs to, and an abort inside a step waits for its end.

``GuardedEngine`` is the Engine the builders return. It subclasses the core ``Engine``
(minispec/core/engine.py) and changes no step of it:
- when a step raises (a bad request, a tokenizer that cannot decode one request's ids), its
  requests are run again one by one: only a request that fails alone ends with FINISHED_ERROR and
  the reason; its neighbours get the tokens they get alone (a seeded request draws the same
  numbers on the second try). A rerun verifies the drafts the step proposed (its drafter's calls
  never raise: DrafterGuard) without asking the drafter again, so the step's draft catch-up stays
  within the token budget, reruns included;
- an ``abort`` asked for while a step runs (by a drafter's propose or an observer) is recorded
  and applied at the step's end, after the step's results: the executor and the scheduler never
  lose a request in the middle of a step, and the draft blocks a drafter allocated for it during
  the step come back too.
Invariant: a refused or failed request draws nothing from the engine's generator and leaves its
neighbours' outputs as they are. Read after the core (docs/architecture.md, lifecycle steps 6-7).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from minispec.core.batch import Batch, EmittedTokens, KeptTokens, ScheduledRequest, StepResult
from minispec.core.engine import Engine
from minispec.core.request import Request, RequestOutput

log = logging.getLogger("minispec")


def _chain(obj) -> str:
    """``obj``'s class and the minispec classes it subclasses, most derived first ("A -> B")."""
    return " -> ".join(c.__name__ for c in type(obj).__mro__ if c.__module__.startswith("minispec."))


def _reason(exc: Exception) -> str:
    """An exception as a failed request's reason: its type and message."""
    return f"{type(exc).__name__}: {exc}"


class GuardedEngine(Engine):
    """An Engine whose failures stay with their requests and whose aborts inside a step wait for
    its end (see the module doc). Args: as Engine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stepping = False  # inside step(): aborts wait for its end (``_aborts``)
        self._aborts: list[str] = []

    # the stack's parts by name (None where absent: a simulated runner); exercises swap runner and drafter
    runner = property(lambda self: getattr(self.executor, "runner", None),  # the target's ModelRunner
                      lambda self, runner: setattr(self.executor, "runner", runner))
    cost_model = property(lambda self: getattr(self.executor, "cost_model", None))  # cost/model.py
    grammars = property(lambda self: getattr(self.executor, "grammars", None))  # StructuredOutputManager
    drafter = property(lambda self: getattr(self.executor, "drafter", None),  # its DrafterGuard
                       lambda self, drafter: setattr(self.executor, "drafter", drafter))

    def describe(self) -> str:
        """The stack that runs, one line a part: engine, scheduler and KV blocks, executor, runner
        (kernels, weights, CUDA graphs), drafter and its guard, policy, grammar manager. Each class is
        named with the chain of minispec classes it subclasses, down to the core's (the ones a
        student reads first: docs/architecture.md's reading order)."""
        ex, runner, drafter = self.executor, self.runner, self.drafter
        lines = [f"engine: {_chain(self)}", f"scheduler: {_chain(self.scheduler)}, blocks "
                 f"{_chain(self.block_manager)} ({self.block_manager.num_blocks} x "
                 f"{self.block_manager.block_size} tokens)", f"executor: {_chain(ex)}"]
        if runner is not None:
            graphs = "on" if getattr(runner, "capture", False) else "off"
            lines.append(f"runner: {_chain(runner)}; kernels {runner.kernels}, weights {runner.weights}, "
                         f"CUDA graphs {graphs}")
        inner = getattr(drafter, "inner", None)
        lines.append("drafter: none (no speculation)" if drafter is None else
                     f"drafter: {_chain(inner)} inside {type(drafter).__name__}" if inner is not None
                     else f"drafter: {_chain(drafter)}")
        policy = self.scheduler.policy
        lines.append(f"policy: {type(policy).__name__ if policy is not None else 'none'}")
        if self.grammars is not None:
            lines.append(f"grammar: {_chain(self.grammars)}, jump-forward "
                         f"{'on' if getattr(ex, 'jump_forward', False) else 'off'}")
        return "\n".join(lines)

    def abort(self, request_id: str) -> RequestOutput:
        """As Engine.abort; called while a step runs, the abort is recorded and takes effect at
        the step's end. The output returned then shows the request as it stands (not yet
        finished); that step's return holds its final, aborted output.

        Raises: ValueError for an id that is not waiting or running (or already aborted in this step).
        """
        if not self._stepping:
            return super().abort(request_id)
        req = self.requests.get(request_id)
        if req is None or req.finished or request_id in self._aborts:
            raise ValueError(f"abort: unknown request id {request_id!r} "
                             "(no waiting or running request has it)")
        self._aborts.append(request_id)
        return self._output(req, [])

    def step(self) -> list[RequestOutput]:
        """As Engine.step; aborts asked for during the step are applied at its end, also when the
        step raises."""
        self._stepping = True
        try:
            outputs = super().step()
        finally:
            self._stepping = False
            aborted = self._apply_aborts()
        if aborted:
            row = {out.request_id: i for i, out in enumerate(outputs)}
            for req in aborted:  # the final output, with the tokens the step gave it before the abort
                i = row.get(req.request_id)
                out = self._output(req, outputs[i].new_token_ids if i is not None else [])
                if i is None:
                    outputs.append(out)
                else:
                    outputs[i] = out
        return outputs

    def _apply_aborts(self) -> list[Request]:
        """Abort the requests ``abort`` recorded during the step that just ended, except those the
        step finished anyway. Returns the requests aborted."""
        aborted = []
        for rid in self._aborts:
            req = self.requests.get(rid)
            if req is not None and not req.finished:
                super().abort(rid)
                aborted.append(req)
        self._aborts.clear()
        return aborted

    def _execute(self, batch: Batch) -> StepResult:
        """Run the batch; if it raises, run its requests one by one so that only a request that
        fails alone fails: its EmittedTokens carry no token and the ``error`` that ends it."""
        try:
            return self.executor.execute(batch)
        except Exception as exc:
            if len(batch.scheduled) == 1:
                log.exception("step failed")
                return StepResult([EmittedTokens([], error=_reason(exc))])
            log.warning("a step of %d requests failed (%s): running them one by one to find the one at fault",
                        len(batch.scheduled), _reason(exc))
        outputs, draft_s, target_s = [], 0.0, 0.0
        for s in batch.scheduled:
            try:
                one = self.executor.execute(Batch([self._replay(s)], num_running=batch.num_running,
                                                  num_waiting=batch.num_waiting))
            except Exception as exc:
                log.exception("request %s failed", s.request.request_id)
                outputs.append(EmittedTokens([], error=_reason(exc)))
                continue
            outputs.append(one.outputs[0])
            draft_s, target_s = draft_s + one.draft_time_s, target_s + one.target_time_s
        return StepResult(outputs, draft_s, target_s)

    @staticmethod
    def _replay(s: ScheduledRequest) -> ScheduledRequest:
        """``s`` as its rerun runs it: with the drafts the step proposed for it and k 0, so that
        the executor verifies them without asking the drafter to propose again. A second proposal
        would run a second draft catch-up, outside the step's budget (issue 41)."""
        return replace(s, num_speculative_tokens=0)

    def _keep(self, s: ScheduledRequest, out: EmittedTokens) -> KeptTokens:
        """As Engine._keep; a failed request keeps nothing, and a stop check that raises (e.g. a
        tokenizer that cannot decode this request's ids) fails its request alone."""
        if out.error is not None:
            return KeptTokens(out)
        try:
            return super()._keep(s, out)
        except Exception as exc:
            log.exception("the stop check of request %s failed", s.request.request_id)
            return KeptTokens(EmittedTokens([], error=_reason(exc)))
