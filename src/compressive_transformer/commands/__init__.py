"""One module per command of ``compressive-transformer``: each declares its ``NAME``, ``HELP``, ``DESCRIPTION``,
``add_arguments(parser)`` and ``main(args)``; :mod:`compressive_transformer.cli` assembles the parser from them.

Adding a command is one module here plus its line in ``cli.COMMANDS``. A command module parses nothing itself and
holds no logic a library user would want: it turns options into a call of the layers below and prints the result.
"""
