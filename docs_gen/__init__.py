"""The documentation's generated pages: the commands from the CLI's own help (click's view of the
Typer app), the analyst schema from the database's catalog with its texts (om_core/store/catalog.py,
catalog_docs.py), and the settings from the settings table (om_core/settings.py). ``python -m
docs_gen`` writes them into docs/reference/; ``--check`` compares instead and fails on drift."""
