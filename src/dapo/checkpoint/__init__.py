"""Checkpoints: saving, verified loading, resume state."""
