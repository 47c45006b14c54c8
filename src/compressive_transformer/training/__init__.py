"""The trainer (one optimizer update for the eager and the captured step), its schedule and distributed setup, and
training a run directory from the command line's arguments to the last checkpoint."""
