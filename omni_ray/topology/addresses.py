"""This host's network addresses, and the check of ``--listen`` against them (pure: no Ray)."""

from __future__ import annotations

import ipaddress

from omni_ray.errors import UserError


def host_addresses() -> list[str]:
    """Every IPv4 and IPv6 address of this host's interfaces (loopback included)."""
    import psutil

    return sorted({a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values()
                   for a in addrs if a.family.name in ("AF_INET", "AF_INET6")})


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback (``::ffff:127.0.0.1``, as ``ss`` shows)."""
    ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def check_listen(listen: str | None, address: str | None,
                 available: list[str] | None = None) -> str | None:
    """``--listen``: None (loopback only), or one address of this host for a local Ray."""
    if listen is None:
        return None
    if address:
        raise UserError(f"--listen {listen}: only for a local Ray; with --address {address} "
                        "the cluster's own nodes chose their addresses")
    try:
        ip = ipaddress.ip_address(listen)
    except ValueError:
        raise UserError(f"--listen {listen}: not an IP address") from None
    if ip.is_unspecified:
        raise UserError(f"--listen {listen}: Ray needs one address of this host, not all "
                        "of them")
    have = host_addresses() if available is None else available
    if str(ip) not in have:
        raise UserError(f"--listen {listen}: not an address of this host (it has "
                        f"{', '.join(have)})")
    return str(ip)
