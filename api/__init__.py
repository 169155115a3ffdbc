"""Receipt's HTTP API: a Flask app built by ``api.app.create_app`` — wiring by construction, no globals.

``api/`` imports ``app/`` (the domain core) and ``delivery/`` (the publish-only Celery client), never
``tasks/`` or ``workers/``: the web process loads no worker code. See ``docs/api.md``.
"""
