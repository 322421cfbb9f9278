"""`om`, the command line (typer + rich): the shell over the library, beside the flows it starts.

flows.cli.main assembles the app from one module per command group; ``python -m flows.cli`` runs it.
"""
