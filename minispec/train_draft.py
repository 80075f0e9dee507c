"""Train, ship and load minispec's own draft model: ``python -m minispec.train_draft``.

Speculation pays only when the draft agrees with the target (Leviathan et al. 2023, section 3.5),
and SmolLM2-135M is the smallest of its family, so minispec distils its own draft:
1. generate: the target answers data/train_prompts/train.jsonl (greedy, and some sampled) with
   minispec's engine; the top-k next-token log-probabilities of every decode step are cached.
2. train: three decoder layers copied from the target learn the target's next-token distribution
   (soft cross-entropy, i.e. KL up to a constant) plus a CE on its greedy token; the input
   embedding and LM head stay the target's own, frozen (minispec.spec.distill).
3. export: only the draft's layers, final norm and vocabulary map go to data/draft/; the frozen
   parts are rebuilt from the target at load time.
The LM head covers the most frequent target tokens only (FR-Spec, Zhao et al. 2025); tokens outside
it get zero draft probability, so verification stays exact (spec/drafters.py).
Invariant: a shipped draft loads only against the target it was distilled from (an embedding
fingerprint is checked). Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from minispec.models.llama import LlamaModel, ModelConfig
from minispec.spec.distill import build_draft, choose_vocab, generate_data, own_parameters, own_state, train

REPO = Path(__file__).resolve().parents[1]
CHECKSUM_ROWS = 64  # target embedding rows fingerprinted in draft_config.json


# -- shipping -------------------------------------------------------------------------------------
def embedding_checksum(target: LlamaModel) -> float:
    """Sum of |weights| of the first embedding rows: tells targets apart, robust to bfloat16 rounding."""
    return float(target.embed_tokens[:CHECKSUM_ROWS].double().abs().sum())


def export_draft(draft: LlamaModel, vocab_map: torch.Tensor, target: LlamaModel, out: Path, meta: dict) -> None:
    """Write ``out/model.safetensors`` (own weights in float16, vocab_map int32) and draft_config.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in own_state(draft).items()}
    tensors["vocab_map"] = vocab_map.to(torch.int32).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    config = {"model_config": asdict(draft.cfg), "target_vocab_size": target.cfg.vocab_size,
              "target_hidden_size": target.cfg.hidden_size, "target_embedding_checksum": embedding_checksum(target),
              "storage_dtype": "float16", **meta}
    (out / "draft_config.json").write_text(json.dumps(config, indent=1) + "\n")


def load_shipped_draft(path, target: LlamaModel, device: torch.device, dtype: torch.dtype):
    """Load minispec's distilled draft from ``path`` for ``target``.

    Returns: (draft LlamaModel in eval mode, None for the tokenizer (it is the target's, checked by
    the embedding fingerprint), vocab_map [V_draft] long on CPU).
    Raises: ValueError when ``target`` is not the model the draft was distilled from.
    """
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / "draft_config.json").read_text())
    tcfg = target.cfg
    same_shape = (tcfg.vocab_size, tcfg.hidden_size) == (config["target_vocab_size"], config["target_hidden_size"])
    if not same_shape or not math.isclose(embedding_checksum(target), config["target_embedding_checksum"],
                                          rel_tol=1e-3):
        raise ValueError(f"the draft in {path} was distilled from {config.get('target')!r} and does not fit this "
                         f"target (vocab {tcfg.vocab_size}, hidden {tcfg.hidden_size}, other embedding weights)")
    tensors = load_file(str(path / "model.safetensors"))
    vocab_map = tensors.pop("vocab_map").long()
    draft = build_draft(target, list(range(config["model_config"]["num_layers"])), vocab_map)
    draft.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    return draft.to(device=device, dtype=dtype).eval().requires_grad_(False), None, vocab_map


# -- command line ---------------------------------------------------------------------------------
def tiny_target(seed: int = 0) -> LlamaModel:
    """The tiny random target of ``--tiny`` (CI): 4 layers, width 64, 512 tokens."""
    cfg = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=True)
    return LlamaModel.random(cfg, seed=seed).eval().requires_grad_(False)


def load_target(args):
    """(target, tokenizer, hf_config, prompts): the real target and prompt set, or with --tiny a tiny
    random target and random token-id prompts (CI: seconds, no model files)."""
    from minispec.models.loader import load_model

    if args.tiny:
        target = tiny_target(args.seed)
        g = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(3, target.cfg.vocab_size, (int(torch.randint(4, 12, (1,), generator=g)),),
                                 generator=g).tolist() for _ in range(12)]
        return target, None, None, prompts
    from minispec.workload import load_prompts

    target, tokenizer, hf_config = load_model(args.target, torch.device("cpu"), torch.float32)
    return target, tokenizer, hf_config, load_prompts(args.prompts)


# defaults for the real run, then for --tiny
DEFAULTS = {"max_tokens": (128, 8), "num_sampled": (160, 4), "layers": ("0,1,2", "0,3"),
            "vocab_size": (8192, 128), "steps": (1100, 4), "batch_tokens": (1024, 64), "ckpt_every": (50, 2)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minispec.train_draft", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct", help="target alias or directory")
    p.add_argument("--prompts", default=str(REPO / "data" / "train_prompts" / "train.jsonl"))
    p.add_argument("--work-dir", default=str(REPO / "runs" / "draft"), help="cache and checkpoints (git-ignored)")
    p.add_argument("--out", default=str(REPO / "data" / "draft"), help="where the shipped draft is written")
    p.add_argument("--stage", default="all", choices=["generate", "all"], help="stop after generating data, or not")
    p.add_argument("--max-tokens", type=int, help="target completion length (128)")
    p.add_argument("--num-sampled", type=int, help="prompts answered again with sampling (160)")
    p.add_argument("--temperature", type=float, default=0.7, help="for the sampled answers")
    p.add_argument("--layers", help="target layers the draft starts from (0,1,2)")
    p.add_argument("--vocab-size", type=int, help="draft LM-head size, most frequent tokens (8192)")
    p.add_argument("--steps", type=int, help="optimizer steps (1100)")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per batch (1024)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--ce-weight", type=float, default=1.0, help="weight of the CE on the target's greedy token")
    p.add_argument("--ckpt-every", type=int, help="steps between checkpoints and validations (50)")
    p.add_argument("--max-minutes", type=float, default=88.0,
                   help="stop training (keeping the best checkpoint) once this run has taken this long")
    p.add_argument("--resume", action="store_true", help="continue from work-dir/ckpt.pt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch threads; 1 is fastest on a shared 2-core machine (2 threads stall)")
    p.add_argument("--tiny", action="store_true", help="tiny random target, a few steps (CI)")
    args = p.parse_args(argv)
    for name, (real, tiny) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else real)
    if args.tiny:
        args.target = "tiny-random"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    start = time.time()
    args.deadline = start + 60 * args.max_minutes
    work = Path(args.work_dir)
    target, tokenizer, hf_config, prompts = load_target(args)
    records = generate_data(target, tokenizer, hf_config, prompts, work, args.max_tokens, args.num_sampled,
                            args.temperature, args.seed)
    print(f"{len(records)} sequences, {sum(len(r['output_ids']) for r in records)} target tokens, "
          f"{time.time() - start:.0f} s")
    if args.stage == "generate":
        return 0
    from minispec.engine import eos_ids

    gen_s = time.time() - start
    layer_ids = [int(x) for x in args.layers.split(",")]
    vocab_map = choose_vocab(records, target.cfg.vocab_size, args.vocab_size, eos_ids(tokenizer, hf_config))
    to_draft = torch.full((target.cfg.vocab_size,), -1, dtype=torch.long)
    to_draft[vocab_map] = torch.arange(len(vocab_map))
    order = list(range(len(records)))
    random.Random(args.seed).shuffle(order)
    num_val = max(1, len(records) // 25)
    val_recs = [records[i] for i in order[:num_val]]
    train_recs = [records[i] for i in order[num_val:]]
    draft = build_draft(target, layer_ids, vocab_map)
    for p in own_parameters(draft):
        p.requires_grad_(True)
    result = train(draft, train_recs, val_recs, to_draft, args, work)
    draft.load_state_dict(result["state"], strict=False)
    covered = sum(int((to_draft[torch.tensor(r["output_ids"])] >= 0).sum()) for r in records)
    meta = {"target": args.target, "init_layers": layer_ids, "training": {
        "command": "python -m minispec.train_draft " + " ".join(argv if argv is not None else sys.argv[1:]),
        "num_sequences": len(records), "num_target_tokens": sum(len(r["output_ids"]) for r in records),
        "vocab_coverage_of_target_tokens": covered / sum(len(r["output_ids"]) for r in records),
        "steps": result["steps"], "best_step": result["step"], "val_top1_agreement": result["val_agreement"],
        "generate_s": round(gen_s), "train_s": round(result["train_s"]), "seed": args.seed}}
    export_draft(draft, vocab_map, target, Path(args.out), meta)
    print(f"wrote {args.out}: best step {result['step']}, validation top-1 agreement "
          f"{result['val_agreement']:.3f}, total {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
