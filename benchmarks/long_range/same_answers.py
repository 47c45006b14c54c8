"""Why max pooling and most-used give the same passkey accuracies: are they the same model, or different models
that give the same answers?

    OMP_NUM_THREADS=1 python -m benchmarks.long_range.same_answers --seed 1

Trains both cells exactly as ``task long-range --preset full --models ct-max_pool-none,ct-most_used-none`` does
(``run_one``: the same seed, the same batches, no checkpoint written or read), in one process, then evaluates both
on the same evaluation examples and compares them answer by answer: how far apart their weights are, how often their
answers agree, how far apart their answer log-probabilities are, and what each model answers with the other's
compressor (the weights of a parameter-free compressor are the same set, so they load into either).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from compressive_transformer.core.models import build_model
from compressive_transformer.experiments.long_range import PRESETS, train_config
from compressive_transformer.experiments.tasks.generators import IGNORE_INDEX, make_batch
from compressive_transformer.experiments.tasks.training import (
    TaskRunConfig,
    _eval_configs,
    stream_task_batch,
    train_task,
)

CELLS = ("ct-max_pool-none", "ct-most_used-none")


def answers(model, task, seed: int, per_value: int) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and true answers on the evaluation examples ``evaluate_task`` draws (same generator, same order)."""
    model.eval()
    rng = np.random.default_rng(1_000_003 + seed)
    pred, true = [], []
    with torch.no_grad():
        for cfg in _eval_configs(task):
            tokens, targets, _ = make_batch(cfg, per_value, rng)
            res = stream_task_batch(
                model, torch.from_numpy(tokens), torch.from_numpy(targets), seg_len=model.cfg.seg_len
            )
            mask = targets != IGNORE_INDEX
            pred.append(res.predictions.numpy()[mask])
            true.append(targets[mask])
    return np.concatenate(pred), np.concatenate(true)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    preset = PRESETS["full"]
    task = preset.tasks()["passkey"]
    vocab = max(c.vocab_size for c in preset.tasks().values())
    models, preds = {}, {}
    for name in CELLS:
        run = TaskRunConfig(
            preset.model(name, vocab), task, train_config(preset, seed=args.seed, steps=None, ablation=True)
        )
        torch.manual_seed(run.train.seed)
        model = build_model(run.model)
        train_task(model, run.task, run.train)
        models[name] = model
        preds[name], true = answers(model, task, args.seed, run.train.eval_per_value)
    a, b = (models[n] for n in CELLS)
    diff = max(float((p - q).abs().max()) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    swapped = {}
    for name, other in zip(CELLS, reversed(CELLS)):
        twin = build_model(models[other].cfg)
        twin.load_state_dict(models[name].state_dict())
        swapped[f"{name} weights, {other.split('-')[1]} compressor"] = float(
            (answers(twin, task, args.seed, 64)[0] == true).mean()
        )
    report = {
        "seed": args.seed,
        "accuracy": {n: float((preds[n] == true).mean()) for n in CELLS},
        "answers_agree": float((preds[CELLS[0]] == preds[CELLS[1]]).mean()),
        "answers": int(len(true)),
        "max_abs_weight_difference": diff,
        "accuracy_with_the_other_compressor": swapped,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
