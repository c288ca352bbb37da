"""Who can reach a listening socket: the one classification of a listen address.

``classify_listen`` is the only owner of "is this address loopback, one host address, or every
interface". The planner's exposure checks (planner/exposure.py) and what apply/status print about
each endpoint both call it, so the plan a reviewer reads and the status an operator reads say the
same thing about the same address. Pure, stdlib only: it sits at the bottom of the layering.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

Exposure = Literal["loopback", "host", "all"]

# what each class means, in the words plan and status print
DESCRIPTION: dict[Exposure, str] = {
    "loopback": "loopback only",
    "host": "one host address",
    "all": "every interface",
}

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                             "ip6-loopback"})


def classify_listen(address: str) -> Exposure:
    """``loopback``, ``host`` or ``all`` for the address a server binds (``--host``).

    The unspecified addresses (``0.0.0.0``, ``::``, their IPv4-mapped form, an empty string) bind
    every interface; ``127.0.0.0/8``, ``::1`` and the loopback names bind loopback; anything else
    (an IP, or a name that resolves to one) is one host address. ``[::1]`` brackets and a zone
    (``fe80::1%eth0``) are accepted. Compared as parsed addresses, never as strings: ``0``,
    ``0.0.0.0`` and ``::ffff:0.0.0.0`` are the same socket."""
    text = address.strip().strip("[]").split("%", 1)[0]
    if not text or text == "*":
        return "all"
    if text.lower().rstrip(".") in _LOOPBACK_NAMES:
        return "loopback"
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        try:  # inet_aton forms bind() accepts too: "0", "127.1"
            import socket
            ip = ipaddress.ip_address(socket.inet_aton(text))
        except (OSError, ValueError):
            return "host"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return "all"
    if ip.is_loopback:
        return "loopback"
    return "host"
