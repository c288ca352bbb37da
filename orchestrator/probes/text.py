"""Deterministic filler text and token estimates for the probes' prompts.

Owns the haystack the recall probe hides needles in and the prompts the load probe sends: varied
English sentences from a seeded generator (no two neighbours alike, so a model cannot shortcut a
repeating pattern), never containing the needle phrase. Token counts here are *estimates*
(a word or a punctuation mark ≈ one token); the probes calibrate them against the server's own
``usage.prompt_tokens`` and report the server's numbers, not these.
"""

from __future__ import annotations

import random
import re

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_ADJ = ("quiet", "northern", "amber", "rapid", "ancient", "hollow", "silver", "patient",
        "crowded", "distant", "gentle", "rusty", "bright", "narrow", "frozen", "busy")
_NOUN = ("river", "market", "library", "orchard", "harbor", "bridge", "meadow", "workshop",
         "station", "garden", "tower", "valley", "bakery", "mill", "lighthouse", "forest")
_VERB = ("welcomed", "counted", "repaired", "painted", "measured", "described", "carried",
         "planted", "recorded", "followed", "sheltered", "collected")
_PLURAL = ("travellers", "lanterns", "barrels", "letters", "sparrows", "carpenters", "maps",
           "stones", "songs", "boats", "visitors", "apples")
_PLACE = ("Avalon", "Brennick", "Corvale", "Dunmore", "Elstow", "Fairhaven", "Glenrock",
          "Holloway", "Ivybridge", "Juniper", "Kestrel", "Larkspur")


def estimate_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def sentences(seed: int) -> list[str]:
    """An endless-enough supply: 4096 sentences from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(4096):
        year = rng.randint(1650, 1990)
        out.append(
            f"In {year} the {rng.choice(_ADJ)} {rng.choice(_NOUN)} of {rng.choice(_PLACE)} "
            f"{rng.choice(_VERB)} {rng.randint(2, 999)} {rng.choice(_PLURAL)}."
        )
    return out


def filler(n_tokens_est: int, seed: int = 0) -> list[str]:
    """Sentences whose estimated token count first reaches ``n_tokens_est``."""
    pool = sentences(seed)
    out: list[str] = []
    total = 0
    i = 0
    while total < n_tokens_est:
        s = pool[i % len(pool)]
        out.append(s)
        total += estimate_tokens(s)
        i += 1
    return out
