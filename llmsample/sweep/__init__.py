"""``llmsample sweep``, the sampler studio: settings × prompts × seeds decoded as one batch, each
sample measured, each setting's figures with their intervals, and the trade-off drawn.

Torch-free like ``batch``: it plans lines, reads records and measures them; the engine decodes."""
