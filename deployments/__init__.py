"""Deploying om: ``python -m deployments`` registers the Prefect deployments (defined in
``flows.deployments``) on a server with a work pool, and ``pi/`` is the Pi extension and package that
connects a live Pi to om (``om live``). This shell imports the flows; the flows never import it."""
