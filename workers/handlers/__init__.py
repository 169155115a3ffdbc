"""Built-in agent handlers."""
