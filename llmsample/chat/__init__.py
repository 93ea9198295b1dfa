"""``llmsample chat``: a conversation on one cached row of the engine (``engine/session.py``).

``conversation``: the turns, their rendering through the chat template and the saved form;
``talk``: one chat's model, cache and settings, and how a reply is decoded and shown;
``slash``: the slash commands; ``repl``: reading turns from a terminal or a pipe."""
