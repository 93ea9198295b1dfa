"""Loading models on every backend. Optional libraries that transformers imports when they are
installed (torchao, from the quant extra) log import-time warnings about kernels for other
hardware; they are quieted here, before any model code imports transformers: diagnostics stay ours."""

import logging

for _noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)
