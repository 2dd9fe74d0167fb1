#!/usr/bin/env python3
"""Counts what an SQLite WAL file holds: commits, frames (whole pages) per commit
and WAL bytes per commit. scripts/bench.sh runs it on cetera's WAL after each
case, to show how many pages a commit writes (the reason for cetera's bytes
written per put).

Usage: scripts/wal-frames.py PATH-TO-state.db-wal [--json]

Only the WAL's current generation is read: frames up to the first one whose
salt differs from the header's (older frames left from before the WAL was
restarted do not count).
"""
import json
import struct
import sys


def analyse(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 32:
        return {"commits": 0, "frames": 0, "page_size": 0}
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(">8I", data[:32])
    frame_size = 24 + page_size
    offset, commits, frames, in_commit, sizes = 32, 0, 0, 0, []
    while offset + frame_size <= len(data):
        _page, commit_size, frame_salt1, frame_salt2 = struct.unpack(">4I", data[offset:offset + 16])
        if (frame_salt1, frame_salt2) != (salt1, salt2):
            break
        frames += 1
        in_commit += 1
        if commit_size:
            commits += 1
            sizes.append(in_commit)
            in_commit = 0
        offset += frame_size
    sizes.sort()
    result = {"page_size": page_size, "commits": commits, "frames": frames}
    if commits:
        result.update(
            frames_per_commit=round(frames / commits, 2),
            frames_per_commit_p50=sizes[len(sizes) // 2],
            wal_bytes_per_commit=round(frames * frame_size / commits),
        )
    return result


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    result = analyse(sys.argv[1])
    if "--json" in sys.argv[2:]:
        print(json.dumps(result))
    else:
        print(", ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
