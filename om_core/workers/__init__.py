"""The three memory workers of SPEC §8: observer, reflector and dropper.

``inputs`` gathers what a worker reads, ``checks`` validates what it proposes (code makes ids,
token counts and validation), ``llm`` runs a worker as a tool-calling model loop, ``offline`` is
the extractive baseline, and ``stages`` reads, runs and appends one stage against the database.
"""
