"""The memory ledger (SPEC §2): its records, validated and imported, and the user's own retirements (forget)."""
