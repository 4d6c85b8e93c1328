"""Which addresses a TCP port listens on, read from the kernel's tables (/proc/net/tcp and tcp6)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

LISTEN = "0A"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:  # IPv4, little-endian
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # IPv6: four little-endian 32-bit words
    return str(ipaddress.IPv6Address(b"".join(words)))


def listening() -> dict[int, set[str]]:
    """Every listening TCP port of this network namespace -> the local addresses it listens on."""
    ports: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state != LISTEN:
                continue
            address, port = local.split(":")
            ports.setdefault(int(port, 16), set()).add(_address(address))
    return ports


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback
