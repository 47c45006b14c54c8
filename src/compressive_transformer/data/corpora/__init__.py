"""The built-in corpus formats, one module each; importing this package registers them in the format table
(:mod:`compressive_transformer.data.formats`) in the order below, which is the order ``data.format`` lists them in.
A new corpus is one more module that calls ``register_format``."""

# isort: off
from compressive_transformer.data.corpora import pydoc, text, enwik8, wikitext, pg19, python_source, audio
# isort: on

__all__ = ["pydoc", "text", "enwik8", "wikitext", "pg19", "python_source", "audio"]
