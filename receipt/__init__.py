"""Receipt's client side: the typed HTTP client (``receipt.client``) and the developer CLI.

Nothing here imports the server packages (``app``, ``api``, ``tasks``, ``workers``): a caller
installs Receipt to talk to a deployment over HTTP, with ``RECEIPT_URL`` and ``RECEIPT_TOKEN``.
"""
