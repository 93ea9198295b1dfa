"""One module per command; each imports torch and transformers only when it runs."""
