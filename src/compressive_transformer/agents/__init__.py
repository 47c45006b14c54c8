"""Memory for agents: a step-at-a-time memory core with per-environment resets (``agents.core``, torch only), an
IMPALA-style actor-critic with V-trace from TorchRL (``agents.actor_critic``), memory environments on gymnasium and
MiniGrid (``agents.envs``) and the training loop behind ``compressive-transformer rl train`` (``agents.train``). All
but the cores need the ``[rl]`` extra."""
