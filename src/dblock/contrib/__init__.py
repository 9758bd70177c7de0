"""Integrations with frameworks users already run. Each module imports its framework and is
behind an extra of the same name (``pip install 'dblock[celery]'``); ``import dblock`` loads
none of them."""
