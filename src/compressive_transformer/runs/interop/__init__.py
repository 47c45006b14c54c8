"""Reading checkpoints of other libraries into this one's runs and exports."""
