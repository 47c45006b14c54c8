"""lm-evaluation-harness integration (the ``[lm-eval]`` extra): :mod:`.scoring` answers the harness's requests in
token ids with memory carried (no harness needed); :mod:`.model` is the harness model class, registered as
``compressive-transformer`` when imported; :mod:`.command` is the ``compressive-transformer lm-eval`` command."""
