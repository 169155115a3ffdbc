"""Delivery's one home: the publish-only Celery client every Receipt process sends through.

``DeliveryClient`` (``delivery/client.py``) sends a task by name, wakes the dispatch scanner through
the coalescing wake list (``delivery/wakes.py``), and reads what the broker can say about delivery:
queue depths and consumers. ``delivery/broker.py`` tells the recovery loops the broker's epoch;
``delivery/redis_transport.py`` is the kombu transport every publisher loads on a Redis broker.

The web process (``api``) imports this package, so it imports nothing from ``tasks`` or ``workers``
(import-linter contracts in ``pyproject.toml``, run by ``make lint``).
"""
