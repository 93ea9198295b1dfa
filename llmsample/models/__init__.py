"""Loading models on every backend. Optional libraries that transformers imports when they are
installed (torchao, from the quant extra) log import-time warnings about kernels for other
hardware, and torch about their enums: they are quieted when this package is imported, before any
of its modules imports transformers, so every run's diagnostics stay ours. Only errors get through."""

import logging

for _noisy in ("torchao", "torch.utils._pytree", "bitsandbytes", "accelerate"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)
