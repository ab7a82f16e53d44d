"""YAML knowledge cards, shipped as package data (this file lets importlib.resources find them)."""
