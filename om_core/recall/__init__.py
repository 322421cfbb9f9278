"""Finding memory (SPEC §6): the exact evidence behind a memory id, the recall tool's result, source entries' text, and ranked search."""
