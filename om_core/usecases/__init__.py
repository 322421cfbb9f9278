"""Use cases (SPEC §13 and the commands): the live answer, export, status and forget, each combining the rooms below it."""
