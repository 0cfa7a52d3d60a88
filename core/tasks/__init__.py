"""Django's Tasks framework on Sluice: the backend (``core.tasks.backend.SluiceTaskBackend``,
the path TASKS names), the results' values (results.py), their retention (retention.py:
no framework needed, so a worker without it still prunes) and the worker's task handler
(worker.py).  names.py recognises a task's message without the framework (the
dashboard's pages).  framework.py imports ``django.tasks`` or the backport.  docs/tasks.md is the
guide.  Nothing is imported here, so that the retention loads without the framework."""
