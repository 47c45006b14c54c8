"""Built-in run configs, so ``train`` without ``--config`` and ``demo`` work from any install.

``configs/tiny.toml`` and ``configs/pydoc-cpu.toml`` hold the same text (a test keeps them in sync).
"""

from __future__ import annotations

TINY_TOML = """\
# CI-sized Compressive Transformer on the pydoc help topics (bytes): trains in seconds on one CPU core.
[model]
vocab_size = 256
d_model = 32
n_layers = 2
n_heads = 2
d_ff = 64
seg_len = 16
mem_len = 16
cmem_len = 8
compression_rate = 2
compression = "conv"
compression_loss = "attention"
dropout = 0.0

[data]
format = "pydoc"
tokenizer = "bytes"

[train]
seed = 0
steps = 20
batch_size = 4
lr = 1e-3
warmup_steps = 5
accumulate = [[0, 1], [15, 2]]
log_every = 5
val_batches = 5
checkpoint_every = 10
keep_checkpoints = 2
device = "cpu"
num_threads = 1

[eval]
batch_size = 4
"""

DEMO_TOML = """\
# The `compressive-transformer demo` run: a small Compressive Transformer on the pydoc help topics (bytes),
# a few hundred steps in about two minutes on two CPU cores.
[model]
vocab_size = 256
d_model = 128
n_layers = 3
n_heads = 4
d_ff = 384
seg_len = 64
mem_len = 64
cmem_len = 32
compression_rate = 2
compression = "conv"
compression_loss = "attention"
dropout = 0.05

[data]
format = "pydoc"
tokenizer = "bytes"

[train]
seed = 0
steps = 400
batch_size = 16
lr = 3e-3
lr_start = 1e-6
lr_final = 1e-5
warmup_steps = 40
grad_clip = 0.1
accumulate = [[0, 1], [350, 2]]
log_every = 20
val_every = 200
val_batches = 20
checkpoint_every = 100
keep_checkpoints = 2
device = "cpu"
num_threads = 1  # fastest when the cores are shared; 2 helps only on an otherwise idle machine

[eval]
batch_size = 4  # the pydoc validation split has 4 topics: one stream each
"""
