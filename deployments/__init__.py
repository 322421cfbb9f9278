"""Prefect deployments: archive processing and scheduled maintenance of live session folders."""
