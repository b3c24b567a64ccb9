"""Spark GPU resource addresses to CUDA device ordinals, explicitly.

Spark's GPU addresses come from its discovery script, usually physical indices as nvidia-smi
prints them, sometimes UUIDs. CUDA ordinals are positions among the *visible* devices: once
``CUDA_VISIBLE_DEVICES=2,3`` applies, physical GPU 3 is ordinal 1. Treating an address as an
ordinal is right only when nothing renumbers the devices, so the mapping is always spelled out.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from .device import DeviceBackend
from .errors import InvalidArgument


def parse_address_map(text: str) -> dict[str, int]:
    """``"0:1,1:0"`` -> {"0": 1, "1": 0}: an explicit override, address to ordinal."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        address, sep, ordinal = part.rpartition(":")
        address = address.strip()
        if not sep or not address or not (ordinal.strip().isascii() and ordinal.strip().isdigit()):
            raise InvalidArgument(f"GPU address map entry {part!r} is not 'address:ordinal'")
        if address in out:
            raise InvalidArgument(f"GPU address {address!r} appears twice in the address map")
        out[address] = int(ordinal)
    return out


def resolve_gpu_addresses(
    addresses: Iterable[str] | None,
    backend: DeviceBackend,
    *,
    visible_devices: str | None = None,
    address_map: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Map each address to an ordinal. ``None`` (local mode, no GPU resources) maps every
    visible device to itself. ``visible_devices`` defaults to ``CUDA_VISIBLE_DEVICES``."""
    count = backend.device_count()
    if addresses is None:
        return {str(i): i for i in range(count)}
    addresses = [str(a).strip() for a in addresses]
    if len(set(addresses)) != len(addresses):
        raise InvalidArgument(f"GPU addresses {addresses} name a GPU twice")
    if visible_devices is None:
        visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [v.strip() for v in visible_devices.split(",")] if visible_devices else None
    uuids: dict[str, int] | None = None
    out: dict[str, int] = {}
    for address in addresses:
        if address_map and address in address_map:
            ordinal = address_map[address]
        elif address.startswith("GPU-"):
            if uuids is None:
                uuids = {backend.device_uuid(i): i for i in range(count)}
            match = [o for u, o in uuids.items() if u.startswith(address)]
            if len(match) != 1:
                raise InvalidArgument(f"GPU address {address!r} matches {len(match)} visible devices by UUID")
            ordinal = match[0]
        elif visible is not None:
            if address not in visible:
                raise InvalidArgument(f"GPU address {address!r} is not among CUDA_VISIBLE_DEVICES={visible_devices}")
            ordinal = visible.index(address)
        elif address.isascii() and address.isdigit():
            ordinal = int(address)
        else:
            raise InvalidArgument(f"GPU address {address!r} is neither an index nor a GPU UUID")
        if not 0 <= ordinal < count:
            raise InvalidArgument(f"GPU address {address!r} maps to ordinal {ordinal}, but {count} device(s) are visible")
        if ordinal in out.values():
            raise InvalidArgument(f"GPU addresses {addresses} map two addresses to ordinal {ordinal}")
        out[address] = ordinal
    return out
