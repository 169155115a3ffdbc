"""Operator tooling: the ``receipt`` CLI and the one-command supervisor."""
