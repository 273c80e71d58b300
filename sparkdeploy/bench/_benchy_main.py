"""Runs llama-benchy's own command line, unchanged, in this (child) process, with the API key read from stdin.

llama-benchy 0.4.0 takes the key only as `--api-key KEY` (no environment variable), which would put it in
/proc/<pid>/cmdline, readable by every user (`ps`). The parent starts this module without the key, writes the
key as the first line of the child's stdin and closes it; the key is added to `sys.argv` here, in memory only,
before llama-benchy parses its arguments. /proc/<pid>/cmdline keeps the argv the process was started with.
"""

from __future__ import annotations

import sys

from llama_benchy.__main__ import main as llama_benchy_main


def main() -> None:
    key = sys.stdin.readline().rstrip("\r\n")
    args = sys.argv[1:]
    if key:
        args += ["--api-key", key]
    del key
    sys.argv = ["llama-benchy", *args]

    llama_benchy_main()


if __name__ == "__main__":
    main()
