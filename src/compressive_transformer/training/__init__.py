"""The trainer, its schedule and distributed setup; evaluation and generation as library functions; whole workflows
over a run directory (train, evaluate, generate, demo)."""
