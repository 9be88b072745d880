"""A reader of bertlua's pre-training shards (BLSHARD1) in plain Python, for
peers that must see exactly the instances bertlua trains on.

The format is specified in src/bl_loader.h (the C reader is src/data/shard.c).
This reader checks what a peer needs to trust the bytes (magic, version, sizes,
offsets, the FNV-1a checksum, record bounds) and raises ValueError("shard PATH:
why") otherwise.

usage:
  python3 tools/peers/blshard.py dump SHARD     one line per instance (the
      canonical text tests/lua/test_pretrain_reference.lua compares with the
      C reader's): "L len_a M nsp|tokens|positions|labels", numbers space-separated
"""
import struct
import sys

MAGIC = b"BLSHARD1"
HEADER = struct.Struct("<8sIIQIIIIfIQQQQ")  # 80 bytes, src/bl_loader.h
assert HEADER.size == 80
FIELDS = ("magic", "version", "header_bytes", "vocab_hash", "vocab_size", "max_seq_length", "max_predictions",
          "flags", "masked_lm_prob", "token_bytes", "seed", "num_instances", "data_bytes", "checksum")
FNV0, FNV_PRIME, MASK64 = 14695981039346656037, 1099511628211, (1 << 64) - 1


def fnv1a64(data, h=FNV0):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


class Shard:
    """Shard(path): .header (dict), len(shard), shard[k] -> dict(tokens, len_a, nsp, positions, labels)."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        if len(self.data) < HEADER.size:
            self._fail(f"{len(self.data)} bytes, shorter than the 80-byte header")
        h = dict(zip(FIELDS, HEADER.unpack_from(self.data, 0)))
        if h["magic"] != MAGIC:
            self._fail("not a BLSHARD1 file (bad magic)")
        if h["version"] != 1 or h["header_bytes"] != HEADER.size or h["token_bytes"] not in (2, 4):
            self._fail(f"unsupported version {h['version']} / header {h['header_bytes']} / token width "
                       f"{h['token_bytes']}")
        n = h["num_instances"]
        table = HEADER.size + 8 * (n + 1)
        if table + h["data_bytes"] != len(self.data):
            self._fail(f"size {len(self.data)} != header + offsets + data ({table + h['data_bytes']})")
        if fnv1a64(self.data[HEADER.size:]) != h["checksum"]:
            self._fail("checksum mismatch (the file is damaged)")
        self.header, self.n, self.base = h, n, table
        self.offsets = struct.unpack_from(f"<{n + 1}Q", self.data, HEADER.size)
        self.tok = "<H" if h["token_bytes"] == 2 else "<I"

    def _fail(self, why):
        raise ValueError(f"shard {self.path}: {why}")

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        if not 0 <= k < self.n:
            raise IndexError(k)
        lo, hi = self.offsets[k], self.offsets[k + 1]
        if not lo <= hi <= self.header["data_bytes"]:
            self._fail(f"record {k}: offsets out of range")
        rec = memoryview(self.data)[self.base + lo: self.base + hi]
        L, len_a, m, nsp, _ = struct.unpack_from("<HHHBB", rec, 0)
        tb = self.header["token_bytes"]
        if 8 + L * tb + m * (2 + tb) > len(rec) or not 1 <= L <= self.header["max_seq_length"] or len_a > L or m > L:
            self._fail(f"record {k}: lengths do not fit")
        w = "H" if tb == 2 else "I"
        tokens = struct.unpack_from(f"<{L}{w}", rec, 8)
        positions = struct.unpack_from(f"<{m}H", rec, 8 + L * tb)
        labels = struct.unpack_from(f"<{m}{w}", rec, 8 + L * tb + 2 * m)
        return {"tokens": tokens, "len_a": len_a, "nsp": nsp, "positions": positions, "labels": labels}


def dump_line(r):
    head = f"{len(r['tokens'])} {r['len_a']} {len(r['positions'])} {r['nsp']}"
    return "|".join([head] + [" ".join(map(str, r[k])) for k in ("tokens", "positions", "labels")])


def main(argv):
    if len(argv) != 2 or argv[0] != "dump":
        sys.exit(__doc__)
    try:
        s = Shard(argv[1])
    except (OSError, ValueError) as e:
        sys.exit(f"blshard: {e}")
    out = sys.stdout
    for k in range(len(s)):
        out.write(dump_line(s[k]) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
