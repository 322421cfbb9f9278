"""Project memory (issue 35): the repository a session worked in, the project ledger and its fold, and the project stage that distils it."""
