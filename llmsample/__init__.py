"""llmsample: generate text with a Hugging Face causal LM and see how every token was sampled."""

__version__ = "0.1.0"
