"""Schedules: time as an input, kept as receipts (``docs/schedules.md``)."""
