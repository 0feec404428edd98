"""Measurements -> the table, the recommended profiles, the charts, --apply."""
