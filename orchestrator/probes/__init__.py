"""Probes against a live OpenAI-compatible endpoint: recall at depth, load, chat behaviours.

Owns measuring a running deployment the way its users feel it (research: the operator found the
recall bug and the parser problems only by probing by hand). Modules: :mod:`.client` (stdlib
asyncio HTTP), :mod:`.recall`, :mod:`.load`, :mod:`.chat`, :mod:`.png` (the recall heatmap),
:mod:`.qualify` (the gate apply runs). Used by ``dsv4ctl probe`` and by apply; ``dsv4ctl plan``
never imports this package.
"""
