"""``llmsample batch``'s input and output: request parsing, result records, resuming a killed run.

Torch-free on purpose: a bad input file is reported before the model loads, and the records can
be read and written by tools that never sample.
"""
