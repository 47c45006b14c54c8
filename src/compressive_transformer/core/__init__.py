"""The model family, pure PyTorch: attention and its kernels, the memory update, compression functions and losses,
temporal range and context length, the models and their decoder, and the extension tables they read (as data); with
the floor every layer stands on (configs, constants, the atomic file writer). No run directories, no command line."""
