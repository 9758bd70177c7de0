"""APScheduler jobs wrapped in client.scheduled (docs/celery.md, "APScheduler")."""
