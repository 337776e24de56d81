"""Placeholder; see the package docstring of geryon."""
