"""The built-in corpus formats, one module each with its ``files(cfg, split)``, ``read(cfg, split)`` and, where it can
be downloaded, ``SOURCES``; the rows that name them are in :data:`compressive_transformer.core.registry.FORMATS`."""
