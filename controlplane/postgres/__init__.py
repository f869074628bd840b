"""Django's PostgreSQL backend, with one addition (base.py)."""
