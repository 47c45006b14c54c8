"""The model family, pure PyTorch: attention, the memory update, compression functions, the kv cache, temporal range
and context length, the models and their decoder, and the registries they read; with the floor every layer stands on
(configs, constants, the atomic file writer). No run directories, no command line."""
