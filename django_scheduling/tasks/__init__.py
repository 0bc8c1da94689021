"""Tasks: what the code declares (``@scheduled``, the registry), the engines a firing may
enqueue on, and each task resolved with the project's settings."""
