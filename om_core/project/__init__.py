"""Project memory: the repository a session worked in, the project ledger and its fold, and the project stage that distils it."""
