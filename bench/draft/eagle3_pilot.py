"""Pilot: does EAGLE-3's fused multi-layer feature help minispec's EAGLE head? Two heads, one change.

Both heads are built and trained alike (``build_eagle`` from the target's last layer, the shipped
head's FR-Spec vocabulary, train/distill_eagle.py's loss with 3 training-time-test steps, the same
batches in the same order, the same steps), on teacher-forced first exchanges of ShareGPT
conversations, and scored on held-out conversations by the top-1 agreement of each unroll step
with the target's greedy token. The one difference is what the head's first step reads:

- ``last``: the target's final hidden state f_t (the shipped design; EAGLE, Li et al. 2024).
- ``fused``: a learned [3E, E] projection of the outputs of three target layers, low, middle and
  high (EAGLE-3, Li et al. 2025, sec. 3: "low, middle, and high-level features"; layers 2, L/2 and
  L - 3 here, each RMS-normalised without a weight so that no layer's scale dominates), started as
  a copy of the high layer's share. Later steps read the head's own output, as in ``last``.
  Both keep the pull of the first predicted feature toward f_t (EAGLE-3 drops it; that would be a
  second change).

A pilot: minutes of training from scratch, far from the shipped head's hours, so it compares the
two inputs at equal cost, not what either reaches.

    python -m bench eagle3_pilot     # needs requirements-train.txt; writes bench/results/eagle3_pilot.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minispec.models.draft import load_draft  # noqa: E402
from minispec.models.eagle import build_eagle  # noqa: E402
from minispec.models.llama import dense_causal_attention, rms_norm  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, load_model  # noqa: E402
from minispec.train.distill import TOP_K, make_batches, make_optimizer, own_parameters, target_ce  # noqa: E402
from minispec.train.distill_eagle import eagle_batch, unroll  # noqa: E402
from minispec.train.sharegpt import exchange_ids, read_conversations, split_conversations  # noqa: E402


@torch.no_grad()
def label(target, pairs, layer_ids, batch_tokens=4096):
    """Teacher-forced records as train/sharegpt.teacher_forced_records makes them, plus
    ``layers`` [P + T, 3E] float16: the chosen layers' outputs, each RMS-normalised."""
    records = [{"prompt_ids": p, "output_ids": a} for p, a in pairs]
    eps = target.cfg.rms_norm_eps
    for idx in make_batches(records, batch_tokens, 0, 0):
        seqs = [records[i]["prompt_ids"] + records[i]["output_ids"] for i in idx]
        ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
        for b, seq in enumerate(seqs):
            ids[b, : len(seq)] = torch.tensor(seq)
        x = F.embedding(ids, target.embed_tokens)
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        cos, sin = target.rope(positions)
        taken = []
        for n, layer in enumerate(target.layers):
            x = layer(x, cos, sin, lambda q, k, v: dense_causal_attention(q, k, v, target.scale))
            if n in layer_ids:
                taken.append(rms_norm(x, torch.ones_like(target.norm), eps))
        hidden = rms_norm(x, target.norm, eps)
        fused_in = torch.cat(taken, dim=-1)
        for b, (i, seq) in enumerate(zip(idx, seqs)):
            p, t = len(records[i]["prompt_ids"]), len(records[i]["output_ids"])
            top = torch.log_softmax(target.compute_logits(hidden[b, p - 1: p + t - 1]), dim=-1).topk(TOP_K, dim=-1)
            records[i] |= {"topk_ids": top.indices.int(), "topk_logprobs": top.values.half(),
                           "features": hidden[b, : len(seq)].half(), "layers": fused_in[b, : len(seq)].half()}
    return records


def batch_layers(records, idx, shape):
    out = torch.zeros(*shape, records[idx[0]]["layers"].shape[-1])
    for b, i in enumerate(idx):
        f = records[i]["layers"]
        out[b, : len(f)] = f.float()
    return out


def loss_and_agreement(head, fc3, records, idx, to_draft, num_steps=3, reg_weight=0.5, ce_weight=1.0):
    """train/distill_eagle.eagle_loss with the first step's input swapped for fc3's fused feature
    when fc3 is given. Returns (loss, agreement per unroll step, answer positions)."""
    next_ids, feats, rows, cols, top_draft, top_lp = eagle_batch(records, idx, to_draft)
    inputs = feats if fc3 is None else batch_layers(records, idx, next_ids.shape) @ fc3
    keep = cols >= 1
    rows, cols, top_draft, top_lp = rows[keep], cols[keep], top_draft[keep], top_lp[keep]
    loss, agree = 0.0, []
    for s, out in enumerate(unroll(head, next_ids, inputs, num_steps)):
        h = out[rows, cols - 1]
        step_loss, step_agree = target_ce(head.compute_logits(h), top_draft, top_lp, ce_weight)
        loss = loss + step_loss + (reg_weight * F.smooth_l1_loss(h, feats[rows, cols]) if s == 0 else 0.0)
        agree.append(step_agree)
    return loss, agree, len(rows)


def train_and_score(kind, target, vocab_map, to_draft, train, val, args):
    torch.manual_seed(args.seed)
    head = build_eagle(target, vocab_map)
    params = own_parameters(head)  # what python -m minispec.train trains: fc, the layer, its norm
    fc3 = None
    if kind == "fused":
        e = target.cfg.hidden_size
        fc3 = torch.nn.Parameter(torch.cat([torch.zeros(2 * e, e), torch.eye(e)]))  # starts as the high layer
        params.append(fc3)
    for p in params:
        p.requires_grad_(True)
    opt, sched = make_optimizer(params, args.lr, args.steps)
    t0, step, epoch, curve = time.time(), 0, 0, []
    while step < args.steps:
        for idx in make_batches(train, args.batch_tokens, args.seed, epoch):
            loss, agree, _ = loss_and_agreement(head, fc3, train, idx, to_draft)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % args.eval_every == 0 or step == args.steps:
                curve.append({"step": step, "val_agreement": score(head, fc3, val, to_draft, args)})
                print(f"{kind} step {step}: validation agreement {curve[-1]['val_agreement']}", file=sys.stderr)
            if step == args.steps:
                break
        epoch += 1
    return {"kind": kind, "train_s": round(time.time() - t0, 1), "curve": curve, "final": curve[-1]["val_agreement"]}


@torch.no_grad()
def score(head, fc3, records, to_draft, args):
    hits, total = [0.0, 0.0, 0.0], 0
    for idx in make_batches(records, args.batch_tokens, 0, 0):
        _, agree, m = loss_and_agreement(head, fc3, records, idx, to_draft)
        hits = [h + a * m for h, a in zip(hits, agree)]
        total += m
    return [round(h / max(total, 1), 4) for h in hits]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-conversations", type=int, default=600)
    p.add_argument("--val-conversations", type=int, default=96)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--layers", default=None, help="the three target layers fused (default 2, L/2, L-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "eagle3_pilot.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.num_threads)
    t0 = time.time()
    target, tokenizer, _ = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    target.requires_grad_(False)
    n_layers = target.cfg.num_layers
    layer_ids = [int(x) for x in args.layers.split(",")] if args.layers else [2, n_layers // 2, n_layers - 3]
    _, _, vocab_map = load_draft("smollm2-135m-draft", target, torch.device("cpu"), torch.float32)
    to_draft = torch.full((target.cfg.vocab_size,), -1, dtype=torch.long)
    to_draft[vocab_map] = torch.arange(len(vocab_map))
    found = read_conversations()
    train_idx, val_idx = split_conversations(found, 400)

    def pairs(indices):
        got = (exchange_ids(tokenizer, found.conversations[i], 256, args.max_len) for i in indices)
        return [x for x in got if x is not None and len(x[1]) >= 2]

    train = label(target, pairs(train_idx[: args.train_conversations]), layer_ids)
    val = label(target, pairs(val_idx[: args.val_conversations]), layer_ids)
    label_s = time.time() - t0
    print(f"labelled {len(train)} training and {len(val)} validation exchanges in {label_s:.0f} s", file=sys.stderr)
    results = [train_and_score(kind, target, vocab_map, to_draft, train, val, args) for kind in ("last", "fused")]
    print(f"\n{len(train)} teacher-forced ShareGPT exchanges ({sum(len(r['output_ids']) for r in train)} answer "
          f"tokens), {args.steps} steps each; top-1 agreement per unroll step on {len(val)} held-out exchanges:")
    for r in results:
        print(f"  {r['kind']:>5}: " + "  ".join(f"step {c['step']}: {c['val_agreement']}" for c in r["curve"]))
    meta = {"layers": layer_ids, "train_exchanges": len(train), "val_exchanges": len(val),
            "train_answer_tokens": sum(len(r["output_ids"]) for r in train), "steps": args.steps, "lr": args.lr,
            "batch_tokens": args.batch_tokens, "label_s": round(label_s, 1), "platform": platform.platform(),
            "torch": torch.__version__, "num_threads": args.num_threads, "wall_s": round(time.time() - t0, 1)}
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
