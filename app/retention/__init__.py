"""Retention: finished streams leave the hot database for an archive, with their proof."""
