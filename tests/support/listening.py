"""Which addresses a local port is listening on, read from the kernel's socket tables."""

from __future__ import annotations

import ipaddress
from pathlib import Path

_LISTEN = "0A"


def listening_addresses(port: int) -> set[str]:
    """Every local address with a socket in LISTEN state on ``port`` (IPv4 and IPv6)."""
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] != _LISTEN or int(port_hex, 16) != port:
                continue
            # The kernel prints each 32-bit word in host (little-endian) byte order.
            raw = b"".join(
                bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, width, 8)
            )
            found.add(str(ipaddress.ip_address(raw)))
    return found
