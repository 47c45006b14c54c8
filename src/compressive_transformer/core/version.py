"""The library's version, at the bottom floor so that an export can record it without importing the package's
top (``compressive_transformer.__version__`` re-exports it)."""

__version__ = "0.1.0"
