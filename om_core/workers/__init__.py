"""The three memory workers of SPEC §8: observer, reflector and dropper.

``stage_kinds`` defines each kind once (a ``Stage`` record: its ledger record and payload model,
input, check, worker, watermark and when it is not due), ``inputs`` gathers what a worker reads,
``checks`` validates what it proposes (code makes ids, token counts and validation), ``llm`` runs a
worker as a tool-calling model loop, ``offline`` is the extractive baseline, and ``stages`` reads,
runs and appends one stage against the database, the same way for every kind.
"""
