"""generation/models."""
