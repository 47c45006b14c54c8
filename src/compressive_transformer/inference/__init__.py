"""Using a trained model: streaming evaluation (bits per character, per byte and per sample), scoring a user's own
text, and generation with memory, as library functions; and the same over a run directory (``evaluate_run``,
``generate_run``). The model's own token-by-token decoder stays in :mod:`compressive_transformer.core.models.decode`."""
