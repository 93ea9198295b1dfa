"""A memory of every run: each ``generate`` and ``speculate``, chat reply, batch request and served
request kept in a SQLite database with its prompt, settings and every token's record (``llmsample logs``)."""
