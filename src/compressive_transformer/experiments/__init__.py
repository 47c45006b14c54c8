"""Ready experiments: training small models on generated long-range tasks and measuring how far back they reach."""

from compressive_transformer.experiments.long_range import PRESETS, Preset, run_long_range, run_task
from compressive_transformer.experiments.tasks import (
    TaskRunConfig,
    TaskTrainConfig,
    evaluate_task,
    load_task_run_config,
    stream_task_batch,
    train_task,
)

__all__ = [
    "PRESETS",
    "Preset",
    "TaskRunConfig",
    "TaskTrainConfig",
    "evaluate_task",
    "load_task_run_config",
    "run_long_range",
    "run_task",
    "stream_task_batch",
    "train_task",
]
