"""The pure core: events, state, the fold, retry and cron timing, ids; no I/O, clock or chance."""
