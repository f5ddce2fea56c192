"""launcher package."""
