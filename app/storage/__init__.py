"""Storage: the database, the receipt store, projections, tokens, delivery records, loop claims, queue
operations and migrations."""
