"""Cron schedules: slot timing with time zones, catch-up and jitter policies, and their fold."""
