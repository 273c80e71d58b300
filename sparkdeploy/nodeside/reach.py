"""Runs ON a node (`images build`'s checks, sparkdeploy/images/build_plan.py): does an address answer from there?
An HTTP answer of any status proves the host is reachable (nvcr.io/v2/ answers 401 without a token); anything else
prints its type and message and exits 1."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    try:
        urllib.request.urlopen(urllib.request.Request(argv[0], method="HEAD"), timeout=10)
    except urllib.error.HTTPError:
        pass
    except Exception as exc:  # noqa: BLE001 - any failure is the answer: said, exit 1
        print(type(exc).__name__, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
