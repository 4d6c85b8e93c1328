"""Which addresses a TCP port listens on, read from the kernel's tables (/proc/net/tcp and tcp6)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

LISTEN = "0A"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:  # IPv4, little-endian
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # IPv6: four little-endian 32-bit words
    return str(ipaddress.IPv6Address(b"".join(words)))


def _listening_rows() -> Iterator[tuple[str, int, str]]:
    """(address, port, socket inode) of every listening TCP socket in this network namespace."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                address, port = fields[1].split(":")
                yield _address(address), int(port, 16), fields[9]


def listening() -> dict[int, set[str]]:
    """Every listening TCP port of this network namespace -> the local addresses it listens on."""
    ports: dict[int, set[str]] = {}
    for address, port, _ in _listening_rows():
        ports.setdefault(port, set()).add(address)
    return ports


def is_loopback(address: str) -> bool:
    """Whether ``address`` is reachable from this machine only (an IPv4-mapped ::ffff:127.x counts)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it (Ray's node processes are the driver's children, workers theirs)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while we looked
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def listening_of_tree(root: int) -> list[tuple[int, str, str, int]]:
    """The listening TCP sockets held by ``root`` and its descendants: (pid, process name, address, port).

    Sockets are matched to processes by inode (/proc/<pid>/fd links), so other runs on the machine
    never count as this one's.
    """
    by_inode = {inode: (address, port) for address, port, inode in _listening_rows()}
    sockets = []
    for pid in sorted(_descendants(root)):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:["):-1] if link.startswith("socket:[") else None
            if inode in by_inode:
                sockets.append((pid, name, *by_inode[inode]))
    return sockets
