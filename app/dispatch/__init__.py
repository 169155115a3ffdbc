"""Fair dispatch: which queued attempt fills a worker group's next free place (docs/dispatch.md)."""
