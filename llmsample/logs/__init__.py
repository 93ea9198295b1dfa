"""A memory of every run: each ``generate`` and ``speculate`` kept in a SQLite database with its
prompt, settings and every token's record (``llmsample logs``)."""
