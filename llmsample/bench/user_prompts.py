"""The four workloads users run (``bench --vs-llamacpp``), as prompts that are the same on every
run: code edits that give the whole file back, JSON records of one shape, open chat questions,
and questions answered from a pasted document by quoting it. Each edit and question its own, so
nothing but what a user's own run holds repeats."""

from __future__ import annotations

INVENTORY = """from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def total_value(items):
    result = 0.0
    for item in items:
        result += item.price * item.quantity
    return result


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best


def restock(items, minimum):
    orders = []
    for item in items:
        if item.quantity < minimum:
            orders.append((item.name, minimum - item.quantity))
    return orders


def describe(items):
    lines = []
    for item in items:
        lines.append(f"{item.name}: {item.quantity} at {item.price:.2f}")
    return "\\n".join(lines)
"""

EDITS = [
    "Rename the variable `result` to `total` in this file. Give back the whole file, with nothing else changed.",
    "Move the function `describe` so that it comes right after the class `Item`. Give back the whole file, with "
    "nothing else changed.",
    "Add the comment `# items below this many units are reordered` on the line above `def restock`. Give back the "
    "whole file, with nothing else changed.",
]

RECORD = '{"id": 1, "name": "Maria Lopez", "job": "nurse", "city": "Madrid", "age": 34, "active": true}'
RECORD_ASKS = [
    "Give 5 more records like this one, as JSON lines (one object per line, the same keys in the same order), "
    "about people in Italy. Only the JSON lines.",
    "Give 5 more records like this one, as JSON lines (one object per line, the same keys in the same order), "
    "about teachers. Only the JSON lines.",
]

CHATS = [
    "What should I pack for a three-day hiking trip in the mountains?",
    "Why do cats purr? Explain it simply.",
    "Give me three ideas for a quick vegetarian dinner.",
    "How does a rainbow form?",
]

DOCUMENT = """The Harbour Library opened in 1911 in a former customs house at the end of Quay Street. Its first \
librarian, Agnes Moore, bought the founding collection of 2,400 books with a grant from the shipping company \
Clarke & Sons, and she kept the reading room open until nine in the evening so that dock workers could come \
after their shifts.

In 1953 a storm flooded the ground floor and destroyed about a third of the books. The town raised money for \
repairs within a month, and the library reopened in the spring of 1954 with the reading room moved to the \
first floor, where it still is today.

Since 2008 the library has lent tools as well as books: drills, ladders and sewing machines can be borrowed \
for a week with an ordinary library card. The tool collection now holds 180 items and is the most borrowed \
part of the library in the summer months. Opening hours are 9 to 18 on weekdays and 10 to 14 on Saturdays."""

QUESTIONS = [
    "Why did the first librarian keep the reading room open in the evening? Quote the sentence that says so.",
    "What happened in 1953, and what changed when the library reopened? Quote the document in your answer.",
]


def code_edit_prompts() -> list[str]:
    """Edits of one file that give the whole file back (rename, reorder, add a comment)."""
    return [f"{edit}\n\n```python\n{INVENTORY}```" for edit in EDITS]


def record_prompts() -> list[str]:
    """Requests for JSON lines of one record's shape."""
    return [f"Here is a record:\n{RECORD}\n\n{ask}" for ask in RECORD_ASKS]


def chat_prompts() -> list[str]:
    return list(CHATS)


def document_prompts() -> list[str]:
    """A pasted document and a question whose answer quotes it."""
    return [f"Read this document:\n\n{DOCUMENT}\n\n{question}" for question in QUESTIONS]


WORKLOADS = {
    "code edits": code_edit_prompts,
    "JSON records": record_prompts,
    "open chat": chat_prompts,
    "document answers": document_prompts,
}
"""Workload name to its prompts (the issue's (a) to (d))."""
TARGETS = {"code edits": 1.5, "JSON records": 1.5, "open chat": 0.97, "document answers": 1.2}
"""Ours over llama-cpp-python's default, the issue's bar for each workload."""
