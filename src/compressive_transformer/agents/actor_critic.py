"""The agent: an observation encoder, a memory core, policy and value heads; and its V-trace loss (IMPALA).

The V-trace targets come from TorchRL (``vtrace_advantage_estimate``); this module only arranges the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.agents.config import RLConfig
from compressive_transformer.agents.core import CoreState, LSTMCore, TransformerCore


@dataclass
class AgentOutput:
    logits: Tensor  # (T, B, n_actions)
    values: Tensor  # (T, B)
    state: CoreState
    aux_loss: Tensor


class ActorCritic(nn.Module):
    def __init__(self, cfg: RLConfig, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(obs_dim, cfg.core.embed_dim), nn.ReLU())
        self.core: TransformerCore | LSTMCore = (
            TransformerCore(cfg.model)
            if cfg.core.kind == "transformer"
            else LSTMCore(cfg.core.embed_dim, cfg.core.lstm_hidden)
        )
        self.policy = nn.Linear(self.core.features, n_actions)
        self.value = nn.Linear(self.core.features, 1)

    def initial_state(self, n_envs: int) -> CoreState:
        return self.core.initial_state(n_envs)

    def forward(self, obs: Tensor, first: Tensor, state: CoreState) -> AgentOutput:
        """obs: (T, B, obs_dim) floats; first: (T, B) bool, True where an episode starts."""
        out = self.core.unroll(self.encoder(obs), state, first)
        return AgentOutput(self.policy(out.features), self.value(out.features).squeeze(-1), out.state, out.aux_loss)


@dataclass
class Rollout:
    """``unroll`` steps of ``n_envs`` environments; observations and ``first`` have one extra step (the bootstrap)."""

    obs: Tensor  # (T + 1, B, obs_dim)
    first: Tensor  # (T + 1, B) bool
    actions: Tensor  # (T, B) long
    behaviour_logp: Tensor  # (T, B) log-probability of the action under the acting policy
    rewards: Tensor  # (T, B)
    done: Tensor  # (T, B) bool: the episode ended (terminated or truncated) with this step
    terminated: Tensor  # (T, B) bool: ended in a terminal state (no bootstrap)


@dataclass
class Losses:
    total: Tensor
    policy: Tensor
    value: Tensor
    entropy: Tensor
    aux: Tensor


def vtrace_losses(
    out: AgentOutput,
    roll: Rollout,
    *,
    gamma: float,
    entropy_cost: float,
    value_cost: float,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> Losses:
    """IMPALA's loss: policy gradient with V-trace advantages, value regression on the V-trace targets, an entropy
    bonus, plus the core's compression loss. ``out`` covers T + 1 steps; the last one only bootstraps the value.

    A truncated episode bootstraps from the value of the next episode's first observation (the vector environment
    replaces the final observation in the same step); the nonmatching task only terminates."""
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    logp_all = F.log_softmax(out.logits[:-1], dim=-1)  # (T, B, A)
    logp = logp_all.gather(-1, roll.actions.unsqueeze(-1)).squeeze(-1)  # (T, B)
    values = out.values
    # TorchRL's layout is (*batch, time, 1)
    to_bt = lambda t: t.transpose(0, 1).unsqueeze(-1)  # noqa: E731
    with torch.no_grad():
        advantages, targets = vtrace_advantage_estimate(
            gamma,
            to_bt(logp.detach()),
            to_bt(roll.behaviour_logp),
            to_bt(values[:-1].detach()),
            to_bt(values[1:].detach()),
            to_bt(roll.rewards),
            to_bt(roll.done),
            to_bt(roll.terminated),
            rho_thresh=rho_clip,
            c_thresh=c_clip,
            time_dim=-2,
        )
    advantages = advantages.squeeze(-1).transpose(0, 1)  # (T, B)
    targets = targets.squeeze(-1).transpose(0, 1)
    policy = -(advantages * logp).mean()
    value = 0.5 * (targets - values[:-1]).pow(2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    total = policy + value_cost * value - entropy_cost * entropy + out.aux_loss
    return Losses(total, policy.detach(), value.detach(), entropy.detach(), out.aux_loss.detach())


__all__ = ["ActorCritic", "AgentOutput", "Losses", "Rollout", "vtrace_losses"]
