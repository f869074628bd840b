import os

from django.core.wsgi import get_wsgi_application

from controlplane.tracing import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
configure_tracing("sagaplane-web")
application = get_wsgi_application()
