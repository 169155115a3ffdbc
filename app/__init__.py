"""Receipt: a durable background-job runtime. The domain core lives here (no Flask, no Celery)."""
