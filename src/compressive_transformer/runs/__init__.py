"""The run directory and everything about it: config files, checkpoints and their integrity, the lock, the memory
budget, metrics, the machine record and precision, loading a run, export and ``from_pretrained``."""
