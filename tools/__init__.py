"""Repository checks run by `make lint` (not part of the study's pipeline)."""
