"""The error every download step raises (fetching, verifying, unpacking): one line that says what to try."""

from __future__ import annotations

from compressive_transformer.core.config import ConfigError


class DownloadError(ConfigError):
    """A download could not be completed or verified; the message says what to try."""


__all__ = ["DownloadError"]
