"""The agent learner's optimizer and learning-rate schedule.

- ``train.optimizer = "adam"``: Adam (epsilon 1e-8). Its step is normalised by the gradient's running magnitude, so
  once an agent has solved its task and the gradients have shrunk to near zero, each step stays about ``lr`` in
  size and the weights keep drifting.
- ``train.optimizer = "rmsprop"``: IMPALA's learner (Espeholt et al. 2018; as TorchBeast runs it in PyTorch): RMSProp
  with decay 0.99, no momentum and a large epsilon (0.01), added to the root of the running mean square. A
  parameter whose gradients are far below epsilon moves by about ``lr * grad / eps``, in proportion to its
  gradient, so a solved agent's near-zero gradients move it little. (TensorFlow's RMSProp, which IMPALA used, adds
  epsilon inside the root; TorchBeast's and this one add it outside.)
- ``train.lr_schedule = "linear"``: the learning rate falls linearly from ``lr`` to 0 at the run's last update, as
  IMPALA's; ``"constant"`` keeps it. The rate of an update is a function of the update's index and the run's length
  alone, so a resumed run continues the schedule where it stopped, bit for bit.
"""

from __future__ import annotations

from typing import Iterable

import torch

from compressive_transformer.agents.config import RLTrainConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], tc: RLTrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``tc`` names, at the run's base learning rate (:func:`learning_rate` sets each update's)."""
    if tc.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=tc.lr, alpha=tc.rmsprop_decay, eps=tc.rmsprop_eps, momentum=tc.rmsprop_momentum
        )
    return torch.optim.Adam(params, lr=tc.lr)


def learning_rate(tc: RLTrainConfig, update: int, total_updates: int) -> float:
    """The learning rate of update ``update`` (0-based) of a run of ``total_updates``: ``lr``, or with the linear
    schedule ``lr * (1 - update / total_updates)`` (the last update's is ``lr / total_updates``; 0 at the end)."""
    if tc.lr_schedule == "linear":
        return tc.lr * max(0.0, 1.0 - update / total_updates)
    return tc.lr


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


__all__ = ["build_optimizer", "learning_rate", "set_learning_rate"]
