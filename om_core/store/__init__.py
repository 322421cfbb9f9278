"""Storage: the DuckDB file, its schema migrations and named SQL, the workspace every command works through, the one writer's lock, runs and helper processes, and the catalog of sessions."""
