"""Training an EAGLE head (models/eagle.py) on the target's own answers and hidden states.

Data: the sequences of minispec.train.distill.generate_data (prompt + the target's answer, with the
target's top-k log-probs at each answer position), plus the target's final hidden state at every
position (and the outputs of the layers a multi-layer head reads, EAGLE-3), recorded while
generating or computed here by one teacher-forced pass of the target (``add_features``).
Loss, per answer position: soft cross-entropy to the target's next-token distribution renormalised
over the draft vocabulary, plus a CE on the target's greedy token, plus a Smooth-L1 pull of the
head's first predicted feature toward the target's (Li et al. 2024, section 3.2).
Training-time test (EAGLE-3, Li et al. 2025, section 3.2): the head is unrolled ``num_steps``
times as it runs when drafting, step s reading its own features from step s - 1, and attending to
the true-feature keys of earlier positions plus its own earlier draft keys, so draft tokens 2..k
are trained on the inputs they will see. Driven by ``python -m minispec.train``; taught in
notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minispec.models.llama import LlamaModel
from minispec.models.eagle import EagleDraft
from minispec.train.distill import batch_tensors, make_batches, padded_ids, target_ce


@torch.no_grad()
def add_features(target: LlamaModel, records: list[dict], cache: Path | None, batch_tokens: int = 4096,
                 capture: tuple[int, ...] = ()) -> None:
    """Set ``r["features"]`` (the target's hidden states after the final norm, after the outputs of
    layers ``capture`` when given: LlamaModel.features, [T, F] float16, T = prompt + answer tokens)
    on every record that lacks them or holds another width (data generated before generate_data
    recorded them, or without the layers), by a teacher-forced pass; cached in ``cache`` when given."""
    width = (len(capture) + 1) * target.cfg.hidden_size
    missing = [r for r in records if "features" not in r or r["features"].shape[-1] != width]
    if missing and cache is not None and cache.exists():
        saved = torch.load(cache)
        if len(saved) == len(missing):
            for r, f in zip(missing, saved):
                r["features"] = f
            return
    for idx in tqdm(make_batches(missing, batch_tokens, 0, 0), desc="target features", disable=not missing):
        seqs, ids = padded_ids(missing, idx)
        hidden = target.hidden_dense(ids, capture)  # causal: padding after a sequence does not change it
        for b, (i, seq) in enumerate(zip(idx, seqs)):
            missing[i]["features"] = hidden[b, : len(seq)].half()
    if missing and cache is not None:
        torch.save([r["features"] for r in missing], cache)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor],
                  values: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Attention of unroll step s = len(keys) as the head sees it while drafting.

    Query i of step s stands for draft token s proposed after true position m = i - s + 1: it sees
    step 1's keys (true features) at positions j <= m, and step t's key at position m + t - 1 for
    t = 2..s (the earlier draft tokens of the same proposal, itself included).
    Args: q [B, T, H, D]; keys, values: per step 1..s, [B, T, Hkv, D]. Returns [B, T, H, D].
    """
    s, (_, t, h, _) = len(keys), q.shape
    group = h // keys[0].shape[2]
    k1, v1 = (x.repeat_interleave(group, dim=2) for x in (keys[0], values[0]))
    scores = torch.einsum("bihd,bjhd->bhij", q, k1) * scale                       # [B, H, T, T]
    pos = torch.arange(t, device=q.device)
    scores = scores.masked_fill(pos[None, :] > pos[:, None] - s + 1, float("-inf"))
    diag_scores, diag_values = [], []
    for step in range(2, s + 1):
        shift = s - step  # step `step`'s key sits `shift` positions before the query
        k, v = (F.pad(x.repeat_interleave(group, dim=2), (0, 0, 0, 0, shift, 0))[:, :t]
                for x in (keys[step - 1], values[step - 1]))
        sc = (q * k).sum(-1) * scale                                              # [B, T, H]
        diag_scores.append(sc.masked_fill((pos < shift)[None, :, None], float("-inf")).transpose(1, 2))
        diag_values.append(v)
    weights = torch.softmax(torch.cat([scores] + [x[..., None] for x in diag_scores], dim=-1), dim=-1)
    out = torch.einsum("bhij,bjhd->bihd", weights[..., :t], v1)
    for n, v in enumerate(diag_values):
        out = out + weights[..., t + n].transpose(1, 2)[..., None] * v
    return out


def unroll(head: EagleDraft, ids: torch.Tensor, features: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """Predicted features of unroll steps 1..num_steps, each [B, T, E].

    Step 1 reads the true features f_i with token x_{i+1} at position i (projected by the head's
    fc3 when it reads several target layers); step s reads the feature step s - 1 predicted at
    position i - 1. Args: ids [B, T] long (x_{i+1} at i), features [B, T, F] (the target's).
    """
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    cos, sin = head.rope(positions)
    layer, keys, values, outs = head.layers[0], [], [], []
    inputs = first = head.project(features)
    for _ in range(num_steps):
        def attend(q, k, v):
            keys.append(k)
            values.append(v)
            return ttt_attention(q, keys, values, head.scale)
        out = head.out_norm(layer(head.fuse(ids, inputs), cos, sin, attend))
        outs.append(out)
        inputs = torch.cat([first[:, :1], out[:, :-1]], dim=1)
    return outs


def eagle_batch(records: list[dict], idx: list[int], to_draft: torch.Tensor):
    """batch_tensors plus the head's inputs: token ids shifted by one ([B, T]: x_{i+1} at i) and the
    padded target features [B, T, F]."""
    ids, rows, cols, top_draft, top_lp = batch_tensors(records, idx, to_draft)
    feats = torch.zeros(*ids.shape, records[idx[0]]["features"].shape[-1])
    for b, i in enumerate(idx):
        f = records[i]["features"]
        feats[b, : len(f)] = f.float()
    next_ids = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
    return next_ids, feats, rows, cols, top_draft, top_lp


def eagle_loss(head: EagleDraft, batch, ce_weight: float, num_steps: int = 3, reg_weight: float = 0.5):
    """Loss of one batch and the top-1 agreement of each unroll step with the target's greedy token.

    The target's log-probs at position t (distribution of x_{t+1}) are what the head predicts at
    position t - 1. Returns (loss, [agreement of step 1, ..., step num_steps]).
    """
    next_ids, feats, rows, cols, top_draft, top_lp = batch
    keep = cols >= 1
    rows, cols, top_draft, top_lp = rows[keep], cols[keep], top_draft[keep], top_lp[keep]
    loss, agree = 0.0, []
    for s, out in enumerate(unroll(head, next_ids, feats, num_steps)):
        h = out[rows, cols - 1]                                                   # [M, E]
        step_loss, step_agree = target_ce(head.compute_logits(h), top_draft, top_lp, ce_weight)
        loss = loss + step_loss
        if s == 0 and reg_weight:  # toward the target's final hidden state: the features' last E columns
            loss = loss + reg_weight * F.smooth_l1_loss(h, feats[rows, cols, -h.shape[-1]:])
        agree.append(step_agree)
    return loss, agree


@torch.no_grad()
def evaluate_eagle(head: EagleDraft, records: list[dict], to_draft: torch.Tensor, batch_tokens: int,
                   num_steps: int = 3) -> list[float]:
    """Per unroll step, the top-1 agreement with the target on validation records (answer positions)."""
    hits, total = [0.0] * num_steps, 0
    for idx in make_batches(records, batch_tokens, 0, 0):
        batch = eagle_batch(records, idx, to_draft)
        _, agree = eagle_loss(head, batch, 0.0, num_steps)
        m = int((batch[3] >= 1).sum())
        hits = [h + a * m for h, a in zip(hits, agree)]
        total += m
    return [h / max(total, 1) for h in hits]


def expected_accepted(agree: list[float], k: int) -> float:
    """Rough mean accepted draft tokens per verify from per-step agreements (chain of k, the last
    agreement reused past the unroll): a quick proxy for validation, not a measurement."""
    total, alive = 0.0, 1.0
    for j in range(k):
        alive *= agree[min(j, len(agree) - 1)]
        total += alive
    return total if not math.isnan(total) else 0.0
