"""Deployment assets for evald; the Python part is the generator in :mod:`deploy.generator`."""
