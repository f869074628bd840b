#!/usr/bin/env python
"""Django's command-line utility for Sagaplane."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    from controlplane.config import ConfigurationError

    try:
        execute_from_command_line(sys.argv)
    except ConfigurationError as exc:
        # The list of problems is the whole story; a traceback through the settings import is noise.
        sys.exit(f"manage.py: {exc}")


if __name__ == "__main__":
    main()
