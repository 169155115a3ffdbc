"""Receipt's client side: the typed HTTP client (``receipt.client``) and the developer CLI.

Nothing here imports the server packages (``app``, ``api``, ``tasks``, ``workers``): a caller
installs Receipt to talk to a deployment over HTTP, with ``RECEIPT_URL`` and ``RECEIPT_TOKEN``.
The one exception is ``receipt.testing``, the test kit: it runs a deployment's queue and worker
path inside a test's process (``docs/testing.md``).
"""
