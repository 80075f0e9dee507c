"""Distillation of a draft model from its target: data, loss and training loop.

The target answers a prompt set with minispec's own engine (greedy and sampled); each decode step's
top-k next-token log-probabilities are kept, so the draft learns the target's distribution on the
target's own text, which is what it must predict when speculating (DistillSpec, Zhou et al. 2024,
section 4: on-policy data). The draft is a few of the target's layers, copied and trained, between
the target's frozen embedding and frozen LM-head columns of a reduced vocabulary (FR-Spec, Zhao et
al. 2025). Invariant: the draft reads target token ids, and draft logit i scores target token
vocab_map[i]. Driven by ``python -m minispec.train``; taught in
notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig
from minispec.models.draft import SHARED_WITH_TARGET, own_state
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams

TOP_K = 32  # target log-probabilities kept per position


# -- the draft's own weights (own_state is in models/draft.py, next to build_draft: loading needs it too) --
def own_parameters(draft: LlamaModel) -> list[nn.Parameter]:
    """The parameters training updates: everything but the target's frozen embedding and LM head."""
    return [p for name, p in draft.named_parameters() if name not in SHARED_WITH_TARGET]


# -- 1. data: the target's own answers and next-token distributions --------------------------------
class Recorder:
    """An engine observer keeping what the target computed for each request, step by step:
    ``rows[request_id]`` lists (ids [M, K] int32, log-probs [M, K] float16), the top-k log-probs of
    every logits row, one entry per step; ``hidden[request_id]`` the features [T, F] float16 of
    every token fed, in order (the final hidden states, F = E, or with a runner capturing layers
    those layers' outputs too: what an EAGLE head learns from, train/distill_eagle.py). Reads
    ``StepRecord.result.forward``."""

    def __init__(self):
        self.rows: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.hidden: dict[str, list[torch.Tensor]] = {}

    def __call__(self, record) -> None:
        forward = record.result.forward
        if forward is None:
            raise RuntimeError("the step carries no forward output (a simulated engine, or a step rerun "
                               "request by request after a fault): nothing to record")
        for s, logits, h in zip(record.batch.scheduled, forward.logits, forward.features):
            rid = s.request.request_id
            self.hidden.setdefault(rid, []).append(h.half().cpu())
            if logits.shape[0]:
                top = torch.log_softmax(logits.float(), -1).topk(TOP_K, dim=-1)
                self.rows.setdefault(rid, []).append((top.indices.int(), top.values.half()))


def generate_data(target, tokenizer, hf_config, prompts: list, work_dir: Path, max_tokens: int,
                  num_sampled: int, temperature: float, seed: int, chunk: int = 48,
                  capture_layers: tuple[int, ...] = ()) -> list[dict]:
    """Target completions with top-k log-probs per output position, cached in work_dir/gen/ by chunk
    (work_dir/gen-L{layers}/ when capturing; a rerun skips finished chunks). Every prompt is
    answered greedily; the first ``num_sampled`` are answered again with ``temperature``. Returns
    records {prompt_ids, output_ids, topk_ids [T, K] int32, topk_logprobs [T, K] float16, features
    [P + T - 1, F] float16: the target's final hidden state at every position it computed (all but
    the last answer token), after the outputs of ``capture_layers`` (LlamaModel.features)}."""
    jobs = [(p, SamplingParams(max_tokens=max_tokens, temperature=0.0)) for p in prompts]
    jobs += [(p, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + i))
             for i, p in enumerate(prompts[:num_sampled])]
    gen_dir = work_dir / ("gen-L" + "-".join(map(str, capture_layers)) if capture_layers else "gen")
    gen_dir.mkdir(parents=True, exist_ok=True)
    records = []
    bar = tqdm(total=len(jobs), desc="generate")
    for c in range(0, len(jobs), chunk):
        shard = gen_dir / f"chunk-{c // chunk:04d}.pt"
        if not shard.exists():
            # 24 blocks of 16 tokens per request: prompt + answer fit, so nothing is preempted
            # float32 weights: the teacher's features at full precision, whatever the engine's default
            config = EngineConfig(device="cpu", dtype="float32", weights="float32", seed=seed,
                                  num_kv_blocks=24 * chunk + 16,
                                  max_model_len=min(384, target.cfg.max_position_embeddings),
                                  scheduler=SchedulerConfig(1024, max_num_seqs=chunk))
            engine = build_engine(config, model=target, tokenizer=tokenizer, hf_config=hf_config,
                                  capture_layers=capture_layers)
            recorder = engine.add_observer(Recorder())
            ids = [engine.add_request(p, params) for p, params in jobs[c: c + chunk]]
            engine.run_until_done()
            part = []
            for rid in ids:
                r = engine.requests[rid]
                rows = recorder.rows[rid]
                if len(rows) != r.num_output_tokens:  # a preempted request was recomputed: skip it
                    continue
                part.append({"prompt_ids": r.prompt_token_ids, "output_ids": r.output_token_ids,
                             "topk_ids": torch.cat([x[0] for x in rows]),
                             "topk_logprobs": torch.cat([x[1] for x in rows]),
                             "features": torch.cat(recorder.hidden[rid])})
            torch.save(part, shard)
        records += torch.load(shard)
        bar.update(len(jobs[c: c + chunk]))
    bar.close()
    return records


# -- 2. training -----------------------------------------------------------------------------------
def choose_vocab(records: list[dict], target_vocab_size: int, size: int, always=()) -> torch.Tensor:
    """FR-Spec vocabulary: the ``size`` target tokens most used by the target's answers (emitted tokens
    plus the probability mass of its top-k), then lower ids (earlier BPE merges) to fill; ``always``
    (EOS, end of turn) is always kept. Returns sorted target ids [size] long."""
    if not 1 <= size <= target_vocab_size:
        raise ValueError(f"vocab size {size}: must be in 1..{target_vocab_size}")
    score = torch.zeros(target_vocab_size, dtype=torch.float64)
    for r in records:
        score += torch.bincount(torch.tensor(r["output_ids"]), minlength=target_vocab_size)
        score.index_add_(0, r["topk_ids"].flatten().long(), r["topk_logprobs"].flatten().double().exp())
    score -= torch.arange(target_vocab_size, dtype=torch.float64) * 1e-9  # ties: the lower id wins
    score[list(always)] = float("inf")
    return score.topk(size).indices.sort().values


def make_batches(records: list[dict], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Record indices per batch, shuffled by (seed, epoch) so a resumed run sees the same order;
    a batch holds at most ``batch_tokens`` tokens once padded to its longest sequence."""
    order = list(range(len(records)))
    random.Random(seed * 1000 + epoch).shuffle(order)
    batches, cur, longest = [], [], 0
    for i in order:
        n = len(records[i]["prompt_ids"]) + len(records[i]["output_ids"])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    return batches + [cur] if cur else batches


def padded_ids(records: list[dict], idx: list[int]) -> tuple[list[list[int]], torch.Tensor]:
    """The sequences (prompt then output) of ``records[idx]`` and their ids padded with 0 after
    each sequence, [B, T] long (a causal model's rows are not changed by padding after them)."""
    seqs = [records[i]["prompt_ids"] + records[i]["output_ids"] for i in idx]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for b, seq in enumerate(seqs):
        ids[b, : len(seq)] = torch.tensor(seq)
    return seqs, ids


def batch_tensors(records: list[dict], idx: list[int], to_draft: torch.Tensor):
    """Padded input ids [B, T], the (row, position) of every output token's prediction [M], and the
    target's top-k as draft ids [M, K] (-1 outside the draft vocabulary) with log-probs [M, K]."""
    _, ids = padded_ids(records, idx)
    rows, cols = [], []
    for b, i in enumerate(idx):
        p, n = len(records[i]["prompt_ids"]), len(records[i]["output_ids"])
        rows += [b] * n
        cols += range(p - 1, p + n - 1)  # the logits at position t predict token t + 1
    top_ids = torch.cat([records[i]["topk_ids"] for i in idx]).long()
    top_lp = torch.cat([records[i]["topk_logprobs"] for i in idx]).float()
    return ids, torch.tensor(rows), torch.tensor(cols), to_draft[top_ids], top_lp


def target_ce(logits: torch.Tensor, top_draft: torch.Tensor, top_lp: torch.Tensor,
              ce_weight: float) -> tuple[torch.Tensor, float]:
    """Soft CE to the target's top-k distribution renormalised over the draft vocabulary (KL(target ||
    draft) up to a constant) + ce_weight * CE on the target's greedy token.

    Args: draft logits [M, V_draft]; the target's top-k as draft ids [M, K] long (-1 outside the
        draft vocabulary, column 0 the greedy token) and log-probs [M, K] float.
    Returns: (loss, top-1 agreement of the draft's argmax with the target's).
    """
    logq = torch.log_softmax(logits, dim=-1)                                      # [M, V_draft]
    inside = top_draft >= 0
    p = top_lp.exp() * inside
    keep = p.sum(-1) > 0
    p = p[keep] / p[keep].sum(-1, keepdim=True)
    soft = -(p * logq[keep].gather(1, top_draft[keep].clamp_min(0))).sum(-1).mean()
    greedy_in = inside[:, 0]
    hard = -logq[greedy_in].gather(1, top_draft[greedy_in, :1]).mean()
    agree = (logq.argmax(-1) == top_draft[:, 0]).float().mean()
    return soft + ce_weight * hard, float(agree)


def distill_loss(draft: LlamaModel, batch, ce_weight: float) -> tuple[torch.Tensor, float]:
    """The layer draft's loss (:func:`target_ce` at every answer position). Returns (loss, top-1
    agreement of the draft's argmax with the target's)."""
    ids, rows, cols, top_draft, top_lp = batch
    return target_ce(draft.forward_dense(ids)[rows, cols], top_draft, top_lp, ce_weight)


@torch.no_grad()
def evaluate(draft: LlamaModel, records: list[dict], to_draft: torch.Tensor, batch_tokens: int) -> float:
    """Top-1 agreement with the target on held-in validation records (output positions)."""
    hits = total = 0
    for idx in make_batches(records, batch_tokens, 0, 0):
        batch = batch_tensors(records, idx, to_draft)
        _, agree = distill_loss(draft, batch, 0.0)
        hits += agree * len(batch[1])
        total += len(batch[1])
    return hits / max(total, 1)


def make_optimizer(params: list[nn.Parameter], lr: float, steps: int):
    """AdamW with a linear warm-up over the first 5% of ``steps``, then a cosine from ``lr`` down to
    0.1 * ``lr``. Returns (optimizer, LR scheduler stepped once per optimizer step)."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    return opt, sched


def batch_order_at(records: list[dict], batch_tokens: int, seed: int,
                   step: int) -> tuple[int, list[list[int]], int]:
    """Where optimizer step ``step`` falls in the seeded batch order: (epoch, that epoch's batches,
    index of the next batch in it). A resumed run replays the order, so it sees the batches an
    uninterrupted run would have seen."""
    epoch, seen, epoch_batches, pos = -1, 0, [], 0
    while seen <= step:
        epoch += 1
        epoch_batches = make_batches(records, batch_tokens, seed, epoch)
        pos = step - seen
        seen += len(epoch_batches)
    return epoch, epoch_batches, pos


def snapshot(draft: LlamaModel, score: float, step: int) -> dict:
    """A copy of the draft's own weights with its validation score: a candidate for the best checkpoint."""
    return {"val_agreement": score, "state": {k: v.clone() for k, v in own_state(draft).items()},
            "step": step}


def save_checkpoint(path: Path, draft: LlamaModel, opt, sched,
                    step: int, elapsed_s: float, best: dict) -> None:
    """Everything a resumed run needs, written to a temporary file then renamed: an interrupted
    write never leaves a broken checkpoint behind."""
    tmp = path.with_suffix(".tmp")
    torch.save({"draft": own_state(draft), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "step": step, "elapsed_s": elapsed_s, "best": best}, tmp)
    tmp.replace(path)


def train(draft: LlamaModel, train_recs: list[dict], val_recs: list[dict], to_draft: torch.Tensor, args,
          work: Path, loss_fn=None, eval_fn=None) -> dict:
    """AdamW with warm-up and a cosine schedule; checkpoint every ``args.ckpt_every`` steps (resumable).

    ``loss_fn(draft, records, idx) -> (loss, agreement)`` and ``eval_fn(draft, records) -> score``
    default to the layer draft's distillation loss and validation top-1 agreement (an EAGLE head
    passes its own, train/distill_eagle.py). The best-scoring checkpoint is returned.
    Returns {"state": best own weights, "val_agreement" (the best score), "steps", "train_s"}."""
    if loss_fn is None:
        def loss_fn(model, records, idx):
            return distill_loss(model, batch_tensors(records, idx, to_draft), args.ce_weight)
    if eval_fn is None:
        def eval_fn(model, records):
            return evaluate(model, records, to_draft, args.batch_tokens)
    params = own_parameters(draft)
    opt, sched = make_optimizer(params, args.lr, args.steps)
    ckpt = work / "ckpt.pt"
    step, elapsed, best = 0, 0.0, snapshot(draft, eval_fn(draft, val_recs), 0)
    if args.resume and ckpt.exists():
        saved = torch.load(ckpt)
        draft.load_state_dict(saved["draft"], strict=False)
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        step, elapsed, best = saved["step"], saved["elapsed_s"], saved["best"]
    print(f"step {step}: validation score {best['val_agreement']:.3f} (best so far)")
    epoch, epoch_batches, pos = batch_order_at(train_recs, args.batch_tokens, args.seed, step)
    bar = tqdm(total=args.steps, initial=step, desc="train")
    t0 = time.time() - elapsed
    while step < args.steps:
        if pos >= len(epoch_batches):
            epoch, pos = epoch + 1, 0
            epoch_batches = make_batches(train_recs, args.batch_tokens, args.seed, epoch)
        loss, agree = loss_fn(draft, train_recs, epoch_batches[pos])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step, pos = step + 1, pos + 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", agree=f"{agree:.3f}", epoch=epoch)
        out_of_time = time.time() > args.deadline
        if step % args.ckpt_every == 0 or step == args.steps or out_of_time:
            val = eval_fn(draft, val_recs)
            if val > best["val_agreement"]:
                best = snapshot(draft, val, step)
            tqdm.write(f"step {step}: validation score {val:.3f} (best {best['val_agreement']:.3f} "
                       f"at step {best['step']})")
            save_checkpoint(ckpt, draft, opt, sched, step, time.time() - t0, best)
        if out_of_time:
            tqdm.write(f"stopping at step {step}: --max-minutes reached")
            break
    bar.close()
    return {**best, "steps": step, "train_s": time.time() - t0}
