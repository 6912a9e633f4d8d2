"""The pure core: events, state, the fold, retry and cron timing, ids. No I/O, clock or randomness."""
