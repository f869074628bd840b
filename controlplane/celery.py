"""The Celery app. In embedded mode the broker is kombu's filesystem transport under the data
folder, so `celery -A controlplane worker -B` runs with no server at all."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
