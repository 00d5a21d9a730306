"""Utilities for ficco's own tests. Nothing here is measured; nothing here is shipped as data."""
