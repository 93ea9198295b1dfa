"""Renderers: they consume token events and summaries, and never touch the model."""
