"""Running the plan: on tune's own processes or through the running service."""
