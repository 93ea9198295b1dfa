"""The CLI as a client of a warm engine (``llmsample start``): where engines are, how to talk to
them, and the records they stream. Nothing here imports torch, transformers or llama_cpp, so a
command that runs on an engine starts in a fraction of a second."""
