"""``llmsample serve``: the OpenAI API over the one decoding loop."""
