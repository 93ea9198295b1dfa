"""The prompts the benchmarks run, the same on every run and machine: chat and story prompts for
one stream, an input-grounded code rewrite (where n-gram drafting pays off), and batches of chat
prompts and code rewrites."""

from __future__ import annotations

CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total += (value - m) ** 2
    return total / len(values)


def normalise(values):
    m = mean(values)
    s = variance(values) ** 0.5
    return [(value - m) / s for value in values]
"""

PROMPTS = {
    "chat": "What is the capital of France? Answer in one sentence, then explain why it is the capital.",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    # Input-grounded: the answer copies most of the prompt, where n-gram drafting pays off.
    "code-rewrite": "Add a comment line `# statistics helpers` at the top of this file and repeat the rest of "
    "the file unchanged.\n\n```python\n" + CODE + "```",
}

TOPICS = ["the sea", "a lighthouse", "bread", "the moon", "trains", "rain", "a library", "bees"]
ASKS = [
    "Write one sentence about {}.",
    "Explain to a child, in a short paragraph, why {} matters to people and how it changed over the centuries.",
    "List three facts about {}.",
    "Describe {} in the style of a weather report, with numbers, a forecast and advice for the weekend ahead.",
]

FUNCTIONS = [
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)",
    "def scale(values, factor):\n    result = []\n    for value in values:\n        result.append(value * factor)\n    return result",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts",
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n        return high\n    return value",
]


SUBJECTS = [
    "the sea", "a lighthouse", "bread", "the moon", "trains", "rain", "a library", "bees", "volcanoes", "glass",
    "chess", "salt", "bridges", "owls", "maps", "copper", "tea", "deserts", "bicycles", "clocks", "coral reefs",
    "paper", "wolves", "windmills", "cheese", "comets", "violins", "rivers", "ants", "castles", "silk", "glaciers",
    "printing presses", "mushrooms", "kites", "penguins", "telescopes", "honey", "canals", "lightning", "cotton",
    "elephants", "postcards", "caves", "lanterns", "oak trees", "whales", "markets",
]  # fmt: skip


def batch_prompts(count: int = 32) -> list[str]:
    """Chat prompts of mixed lengths (about 10 to 35 words), the same on every run."""
    return [ASKS[i % len(ASKS)].format(TOPICS[i % len(TOPICS)]) for i in range(count)]


def distinct_prompts(count: int, start: int = 0) -> list[str]:
    """Prompts ``start`` to ``start + count`` of a sequence of the same kinds as
    :func:`batch_prompts`', each of its first ``len(ASKS) * len(SUBJECTS)`` (192) asking a kind
    of answer about a subject no other asks it about: a benchmark's later rounds then ask what
    earlier ones did not, and a server that drafts from the answers it has seen is measured on
    new ones (numbering the same questions does not do that: the answers stay the same)."""
    pairs = len(ASKS) * len(SUBJECTS)
    found = []
    for n in range(start, start + count):
        k = n % pairs
        found.append(ASKS[(k + k // len(SUBJECTS)) % len(ASKS)].format(SUBJECTS[k % len(SUBJECTS)]))
    return found


def rewrite_prompts(count: int = 16) -> list[str]:
    """Requests that copy from their input, as the single-stream code rewrite: a file given back
    with a comment line added and the rest unchanged, each request its own file (the statistics
    helpers, then the four functions in its own order: ``mean`` is in both, so a draft that
    follows the later copy where the two differ is rejected, which counts against drafting) and
    comment, long enough that the answer copies for the whole benchmark length. More requests
    than rows, as a ``batch`` file has: a row that finishes early is replaced, not left idle.
    (Asked to add type hints and docstrings, the default model rewrites bodies freely and copies
    too little for drafting to pay.)"""
    comments = ["helpers", "statistics helpers", "shared maths", "numeric utilities"]
    prompts = []
    for i in range(count):
        rest = FUNCTIONS[i % len(FUNCTIONS) :] + FUNCTIONS[: i % len(FUNCTIONS)]
        code = CODE + "\n\n" + "\n\n\n".join(rest)
        comment = comments[(i // len(FUNCTIONS)) % len(comments)]
        prompts.append(
            f"Add a comment line `# {comment}` at the top of this file and repeat the rest of the file "
            f"unchanged.\n\n```python\n{code}\n```"
        )
    return prompts
