"""`migrate`, run as the owner role on Postgres (DATABASE_OWNER_URL): the tables, the row-level
security policies and the cross-tenant functions belong to the owner, and the runtime role
(DATABASE_URL) gets only DML grants (core/rls.py). On SQLite it is Django's migrate as is."""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import DEFAULT_DB_ALIAS

from core.rls import database_owner


class Command(DjangoMigrate):
    help = DjangoMigrate.help + " On Postgres, connects as the owner role (DATABASE_OWNER_URL)."

    def execute(self, *args: Any, **options: Any) -> str | None:
        # execute, not handle: the system checks run before handle, and they too must see the
        # owner's connection (core.rls.check_runtime_role leaves it alone).
        with database_owner(options.get("database") or DEFAULT_DB_ALIAS):
            return super().execute(*args, **options)
