"""The agent: an observation encoder, a memory core, policy and value heads; and its V-trace loss (IMPALA).

The V-trace targets come from TorchRL (``vtrace_advantage_estimate``); this module only arranges the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.agents.config import RLConfig
from compressive_transformer.agents.core import CoreOutput, CoreState, LSTMCore, TransformerCore


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
        return self._heads(self.core.unroll(self.encoder(obs), state, first))

    def step(self, obs: Tensor, first: Tensor, state: CoreState) -> tuple[AgentOutput, CoreState]:
        """One step of every environment: obs (B, obs_dim) -> logits (B, A), values (B,), and the memory it read."""
        out = self.core.step(self.encoder(obs), state, first)
        return self._heads(out), out.read

    def replay(self, obs: Tensor, reads: list[CoreState]) -> AgentOutput:
        """A transformer core's T steps (T, B, obs_dim) at once from the memories they read while acting."""
        return self._heads(self.core.replay(self.encoder(obs), reads))

    @property
    def can_replay(self) -> bool:
        return isinstance(self.core, TransformerCore)

    def _heads(self, out: CoreOutput) -> AgentOutput:
        return AgentOutput(self.policy(out.features), self.value(out.features).squeeze(-1), out.state, out.aux_loss)


@dataclass
class Rollout:
    """``unroll`` steps of ``n_envs`` environments; observations and ``first`` have one extra step (the bootstrap)."""

    obs: Tensor  # (T + 1, B, obs_dim)
    first: Tensor  # (T + 1, B) bool
    actions: Tensor  # (T, B) long
    behaviour_logp: Tensor  # (T, B) log-probability of the action under the acting policy
    rewards: Tensor  # (T, B)
    done: Tensor  # (T, B) bool: the episode ended (terminated or truncated) with this step; no bootstrap after it
    reads: list[CoreState] | None = None  # T + 1 memories the steps read (transformer cores: the learner's batch)


@dataclass
class Losses:
    total: Tensor
    policy: Tensor
    value: Tensor
    entropy: Tensor
    aux: Tensor


@torch.no_grad()
def vtrace_targets(
    target_logp: Tensor,
    behaviour_logp: Tensor,
    values: Tensor,
    roll: Rollout,
    *,
    gamma: float,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace (IMPALA, eq. 1): policy-gradient advantages rho_t (r_t + gamma v_{t+1} - V(x_t)) and value targets
    v_t, both (T, B), from log-probabilities (T, B) of the actions under the learner's and the actors' policy and
    values (T + 1, B) (the last one bootstraps)."""
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    to_bt = lambda t: t.transpose(0, 1).unsqueeze(-1)  # noqa: E731  (TorchRL's layout: (*batch, time, 1))
    advantages, targets = vtrace_advantage_estimate(
        gamma,
        to_bt(target_logp),
        to_bt(behaviour_logp),
        to_bt(values[:-1]),
        to_bt(values[1:]),
        to_bt(roll.rewards),
        to_bt(roll.done),
        to_bt(roll.done),  # terminated: a truncated episode counts as ended too (see vtrace_losses)
        rho_thresh=rho_clip,
        c_thresh=c_clip,
        time_dim=-2,
    )
    return advantages.squeeze(-1).transpose(0, 1), targets.squeeze(-1).transpose(0, 1)


def vtrace_losses(
    out: AgentOutput,
    roll: Rollout,
    *,
    gamma: float,
    entropy_cost: float,
    value_cost: float,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
    reduction: str = "mean",
) -> Losses:
    """IMPALA's loss: policy gradient with V-trace advantages, value regression on the V-trace targets, an entropy
    bonus, plus the core's compression loss. ``out`` covers T + 1 steps; the last one only bootstraps the value.
    ``reduction`` "mean" averages over the T x B steps; "sum" (IMPALA's) adds them up, so the total and its gradient
    are T x B times the mean's (the parts reported stay means). Only where the optimizer is not scale-free does
    that matter: against RMSProp's epsilon and the gradient clip.

    A truncated episode is treated as ended (no bootstrap from the state it was cut in, whose observation the vector
    environment replaced by the next episode's first): MiniGrid cuts at its step limit with reward 0, so the bias is
    a small undervaluation of states near the limit; the nonmatching task only terminates."""
    logp_all = F.log_softmax(out.logits[:-1], dim=-1)  # (T, B, A)
    logp = logp_all.gather(-1, roll.actions.unsqueeze(-1)).squeeze(-1)  # (T, B)
    values = out.values
    advantages, targets = vtrace_targets(
        logp.detach(), roll.behaviour_logp, values.detach(), roll, gamma=gamma, rho_clip=rho_clip, c_clip=c_clip
    )
    policy = -(advantages * logp).mean()
    value = 0.5 * (targets - values[:-1]).pow(2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    total = policy + value_cost * value - entropy_cost * entropy + out.aux_loss
    if reduction == "sum":
        total = total * logp.numel()
    return Losses(total, policy.detach(), value.detach(), entropy.detach(), out.aux_loss.detach())


__all__ = ["ActorCritic", "AgentOutput", "Losses", "Rollout", "vtrace_losses", "vtrace_targets"]
