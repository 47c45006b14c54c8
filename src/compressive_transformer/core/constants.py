"""Values shared by the data pipeline, the models and the tasks; kept at the bottom floor so that ``data/`` need not
import ``models/`` to agree with the loss on them."""

from __future__ import annotations

IGNORE_INDEX = -100
"""The target value the loss skips (padding, unanswered positions); PyTorch's cross-entropy default."""

__all__ = ["IGNORE_INDEX"]
