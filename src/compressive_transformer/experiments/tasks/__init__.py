"""Generated long-range tasks (:mod:`.generators`) and training a model on them (:mod:`.training`)."""

from compressive_transformer.experiments.tasks import generators, training
from compressive_transformer.experiments.tasks.generators import *  # noqa: F403  (the public names of both modules, as listed there)
from compressive_transformer.experiments.tasks.training import *  # noqa: F403

__all__ = [*generators.__all__, *training.__all__]
