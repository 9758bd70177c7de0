"""dblock.contrib.celery with real Celery workers (a Redis broker and result backend)."""
