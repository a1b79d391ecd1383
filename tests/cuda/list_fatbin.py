#!/usr/bin/env python3
"""Lists the GPU code embedded in an executable, as `cuobjdump --list-elf/--list-ptx` would, for
toolkits installed without cuobjdump. Reads the fatbinary blocks (magic 0xBA55ED50) and prints one
line per entry: "elf sm_90" or "ptx sm_100". Usage: list_fatbin.py BINARY"""
import struct
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)


def entries(data):
    at = data.find(MAGIC)
    while at != -1:
        if at + 16 <= len(data):
            _, version, header_size, fat_size = struct.unpack_from("<IHHQ", data, at)
            pos, end = at + header_size, at + header_size + fat_size
            if version == 1 and header_size == 16 and end <= len(data):
                while pos + 40 <= end:
                    kind, _, entry_header, padded = struct.unpack_from("<HHII", data, pos)
                    sm = struct.unpack_from("<I", data, pos + 28)[0]
                    if kind in (1, 2) and entry_header >= 40 and 10 <= sm < 1000:
                        yield ("ptx" if kind == 1 else "elf"), sm
                    if entry_header == 0:
                        break
                    pos += entry_header + padded
                at = max(end, at + 1) - 1
        at = data.find(MAGIC, at + 1)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: list_fatbin.py BINARY")
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    found = sorted(set(entries(data)))
    if not found:
        sys.exit(sys.argv[1] + ": no fatbinary found")
    for kind, sm in found:
        print(f"{kind} sm_{sm}")


if __name__ == "__main__":
    main()
