"""R's lazy-load databases (.rdb + .rdx) and XDR serialization, read for plain data types."""
from __future__ import annotations

import struct
import zlib


def r_unserialize(buf: bytes):
    """Decode R's XDR serialization (format 2 or 3) for the plain data types: character, integer,
    logical and double vectors, lists and pairlists. Named vectors/lists become dicts."""
    if not buf.startswith(b"X\n"):
        raise ValueError("not an R XDR serialization")
    pos, refs = 2, []

    def ints(n):
        nonlocal pos
        values = struct.unpack_from(f">{n}i", buf, pos)
        pos += 4 * n
        return values

    def length():
        (n,) = ints(1)
        if n == -1:
            hi, lo = ints(2)
            n = (hi << 32) + lo
        return n

    def item():
        nonlocal pos
        (flags,) = ints(1)
        kind, has_attr = flags & 0xFF, flags & (1 << 9)
        if kind in (241, 242, 250, 251, 252, 253, 254):
            return None
        if kind == 255:
            return refs[(flags >> 8 or ints(1)[0]) - 1]
        if kind == 1:
            refs.append(item())
            return refs[-1]
        if kind == 9:
            n = length()
            if n == -1:
                return None
            pos += n
            return buf[pos - n : pos].decode("latin-1" if flags & (1 << 14) else "utf-8")
        if kind in (2, 6):
            if has_attr:
                item()
            tag = item() if flags & (1 << 10) else None
            car = item()
            return {tag: car, **(item() or {})}
        if kind in (10, 13):
            values = list(ints(length()))
        elif kind == 14:
            n = length()
            values = list(struct.unpack_from(f">{n}d", buf, pos))
            pos += 8 * n
        elif kind in (16, 19, 20):
            values = [item() for _ in range(length())]
        else:
            raise ValueError(f"unsupported R object type {kind}")
        names = (item() if has_attr else {}).get("names")
        return dict(zip(names, values)) if names else values

    if ints(3)[0] == 3:
        (n,) = ints(1)
        pos += n
    return item()


def read_r_lazyload(rdb: bytes, rdx: bytes) -> dict:
    """All variables of an R lazy-load database (.rdb data + gzip-compressed .rdx index)."""
    index = r_unserialize(zlib.decompress(rdx, 47))
    return {
        name: r_unserialize(zlib.decompress(rdb[offset + 4 : offset + length]))
        for name, (offset, length) in index["variables"].items()
    }
