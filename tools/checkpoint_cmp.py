#!/usr/bin/env python3
"""Compares two ringtrain checkpoint files byte for byte, allowing only HDF5's object
modification times to differ.

HDF5 stamps every object header it writes with the time in whole seconds (the v1
"modification time" message, type 0x0012: 8 bytes of version 1, 3 reserved and 4 of
seconds), so two saves of the same state a second apart differ in those bytes and nowhere
else. This tells such files apart from files that really differ: the way to check that a
change to the writer leaves the checkpoint format's bytes alone (run the same training with
the old and the new binary, then compare each checkpoint), or that runs are deterministic.
For the values alone, `h5diff -c A B` compares datasets and attributes.

usage: checkpoint_cmp.py A.h5 B.h5
Prints "identical", "identical but N modification times", or where they differ.
Exit 0 when they are the same (modification times aside), 1 when not, 2 on usage errors.
"""
import sys


def first_difference(a: bytes, b: bytes):
    """(index, None) of the first byte that differs outside a modification time, the count
    of differing modification-time messages, or (None, n)."""
    if len(a) != len(b):
        return min(len(a), len(b)), 0
    stamps = set()
    i = 0
    while True:
        # Jump to the next differing byte: compare in large blocks first.
        while i < len(a) and a[i:i + 4096] == b[i:i + 4096]:
            i += 4096
        while i < len(a) and a[i] == b[i]:
            i += 1
        if i >= len(a):
            return None, len(stamps)
        # i lies in the 4 bytes of seconds starting at s, whose message header (type, size,
        # flags, reserved) and version are 12 bytes before and equal in both files.
        for s in range(i - 3, i + 1):
            h = s - 12
            if h >= 0 and a[h:h + 4] == b"\x12\x00\x08\x00" and a[h + 8] == 1 and a[h:s] == b[h:s]:
                stamps.add(s)
                i = s + 4
                break
        else:
            return i, len(stamps)


def main(argv):
    if argv[1:] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) != 3:
        print("usage: checkpoint_cmp.py A.h5 B.h5 (--help: what it compares)", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as fa, open(argv[2], "rb") as fb:
        a, b = fa.read(), fb.read()
    at, stamps = first_difference(a, b)
    if at is not None:
        what = f"sizes {len(a)} and {len(b)}" if len(a) != len(b) else f"byte {at}"
        print(f"{argv[1]} and {argv[2]} differ: {what}")
        return 1
    print("identical" if stamps == 0 else f"identical but {stamps} modification times")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
