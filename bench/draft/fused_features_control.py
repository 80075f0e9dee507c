"""The control for the fused-feature head (stage 7 of data/draft/MODEL_CARD.md, item 9): train on its
cached labels without the extra target layers, so that the fused input's share of its gain can be told
from the steps'.

Stage 7's records carry [T, 3E] features (target layer 2, layer 15, the final hidden state, in that
order: LlamaModel.features). A head without extra layers reads the final hidden state only, which
is their last E columns, so they are sliced rather than relabelled (that would cost the labelling
again). Everything else is `python -m minispec.train`, given the same flags as stage 7 minus
--feature-layers:

    python -m bench fused_features_control --labels runs/sg7 -- --prompts --sharegpt-answered 2800 \
        --init-from data/draft --keep-vocab --lr 3e-4 --steps 2200 --ckpt-every 200 --max-minutes 36 \
        --num-threads 2 --work-dir runs/sg7c --out runs/full7c/out

--labels is stage 7's work directory; the control's --work-dir gets links to its cached answers.
Result: bench/results/fused_features_control.json.
"""
import argparse
import sys
from pathlib import Path

import minispec.train.command as command


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--labels", required=True, help="stage 7's --work-dir (holds data-*/gen-L2-15/)")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the flags for minispec.train")
    args = p.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    work = Path(train_args[train_args.index("--work-dir") + 1])
    for cached in sorted(Path(args.labels).glob("data-*/gen-L2-15")):
        link = work / cached.parent.name / "gen"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(cached.resolve(), target_is_directory=True)
    add_features = command.add_features

    def final_state_only(target, records, cache, *rest, capture=(), **kw):
        width = target.cfg.hidden_size
        for r in records:
            if not capture and "features" in r and r["features"].shape[-1] == 3 * width:
                r["features"] = r["features"][..., -width:].contiguous()
        return add_features(target, records, cache, *rest, capture=capture, **kw)

    command.add_features = final_state_only
    return command.main(train_args)


if __name__ == "__main__":
    sys.exit(main())
