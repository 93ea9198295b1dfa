"""The benchmarks behind ``llmsample bench`` (``make bench``), one module per concept:

- ``single``: one stream, our loop against transformers' ``generate`` (with ``sides``: the two
  sides of a run, ``timing``: clocks and interleaving, ``costs``: bandwidth and the sampling
  pipeline's own cost, ``startup``: warm start and cold load);
- ``batch``: ``decode_batch`` against transformers' padded batch ``generate`` (``--batch-sizes``);
- ``workloads``: users' batch runs against their easiest form (``--workloads``);
- ``quant``: what quantization buys and costs (``--quant``);
- ``serve_load``: the server under concurrent clients against ``llmsample batch`` (``--serve``),
  ``multi_turn``: a growing chat with the server's prompt cache and without (``--multi-turn``),
  both through ``served`` (a server process and a lean streaming client), and ``serve_peers``:
  the server against llama.cpp's ``llama-server`` (built by ``llama_server``) and
  ``llama_cpp.server`` (``--serve-peers``);
- ``constraint_cost``: what a JSON schema costs a step (``--constraints``), with
  ``public_schemas``: coverage and compliance on the schemas ``public_schemas.json`` lists;
- ``sweep_cost``: ``llmsample sweep`` against ``llmsample batch`` on the same rows (``--sweep``);
- ``results``: the typed figures, the machine they were taken on, and writing them;
- ``prompts``: the prompts every benchmark shares.

Nothing here patches the engine: timings of forward passes come through its ``on_forward`` hook."""
