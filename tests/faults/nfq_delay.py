"""Delay every packet of one netfilter queue by a fixed time: `tc netem delay`, for kernels built without netem.

Runs inside a lab node (python3 only, no library): iptables sends the packets a node puts on an interface to
NFQUEUE QUEUE (`-t mangle -A POSTROUTING -o IFACE -j NFQUEUE --queue-num QUEUE --queue-bypass`: should this
program stop, packets pass undelayed); here each packet's verdict (accept) is given DELAY_MS after it arrived,
in arrival order. Speaks the nfnetlink_queue protocol over a raw netlink socket, metadata only.

    python3 nfq_delay.py DELAY_MS QUEUE
"""

import collections
import os
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER, NFNL_SUBSYS_QUEUE = 12, 3
MSG_PACKET, MSG_VERDICT, MSG_CONFIG = 0, 1, 2
NLM_F_REQUEST = 1
CFG_CMD, CFG_PARAMS, CMD_BIND, COPY_META = 1, 2, 1, 1
PACKET_HDR, VERDICT_HDR, NF_ACCEPT = 1, 2, 1


def attr(kind: int, payload: bytes) -> bytes:
    body = struct.pack("=HH", 4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def message(msg_type: int, queue: int, attrs: bytes) -> bytes:
    payload = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    return struct.pack("=IHHII", 16 + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg_type, NLM_F_REQUEST, 0, 0) + payload


def packet_ids(data: bytes):
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type = struct.unpack_from("=IH", data, offset)
        if length < 16:
            return
        if msg_type == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
            a = offset + 20  # nlmsghdr + nfgenmsg
            while a + 4 <= offset + length:
                alen, akind = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if akind & 0x7FFF == PACKET_HDR:
                    yield struct.unpack_from("!I", data, a + 4)[0]
                a += (alen + 3) & ~3
        offset += (length + 3) & ~3


def main() -> None:
    delay, queue = int(sys.argv[1]) / 1000.0, int(sys.argv[2])
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    sock.send(message(MSG_CONFIG, queue, attr(CFG_CMD, struct.pack("!BBH", CMD_BIND, 0, 0))))
    sock.send(message(MSG_CONFIG, queue, attr(CFG_PARAMS, struct.pack("!IB", 0, COPY_META))))
    due = collections.deque()
    print(f"nfq_delay: queue {queue}, {delay * 1000:g} ms, pid {os.getpid()}", flush=True)
    while True:
        wait = max(0.0, due[0][0] - time.monotonic()) if due else None
        if select.select([sock], [], [], wait)[0]:
            try:
                data = sock.recv(1 << 16)
            except OSError:  # ENOBUFS: the kernel dropped messages; go on
                continue
            now = time.monotonic()
            due.extend((now + delay, pid) for pid in packet_ids(data))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, pid = due.popleft()
            sock.send(message(MSG_VERDICT, queue, attr(VERDICT_HDR, struct.pack("!II", NF_ACCEPT, pid))))


if __name__ == "__main__":
    main()
