#!/usr/bin/env python3
"""The PyTorch side of tests/rendezvous/test_torch_store.cpp's [.torch] case.

Hosts a real torch.distributed.TCPStore (libuv, as torchrun's agent does), sets `from_torch`,
and listens for partrain's client on a port it prints as the first line. With --record FILE it
listens through a byte-logging proxy and writes the exchange (`> hex` client to server, `< hex`
server to client, one line per turn) to FILE: the recorded exchange that the CI case replays.
It prints what partrain's client set (`from_partrain=...`) once the client sets `bye`.

  torch_store_peer.py [--record FILE]
"""
import argparse
import datetime
import select
import socket
import sys
import threading

from torch.distributed import TCPStore


def proxy(listener, port, log):
    client, _ = listener.accept()
    server = socket.create_connection(("127.0.0.1", port))
    turns = []  # [direction, bytes]: consecutive chunks in one direction make one turn
    ends = {client: (server, ">"), server: (client, "<")}
    open_ends = {client, server}
    while open_ends:
        ready, _, _ = select.select(list(open_ends), [], [], 120)
        if not ready:
            break
        for s in ready:
            data = s.recv(65536)
            other, direction = ends[s]
            if not data:
                open_ends.clear()  # either side closing ends the exchange
                break
            other.sendall(data)
            if turns and turns[-1][0] == direction:
                turns[-1][1] += data
            else:
                turns.append([direction, bytearray(data)])
    client.close()
    server.close()
    with open(log, "w") as f:
        f.write("# tests/rendezvous/torch_store_peer.py --record: PyTorch %s's TCPStore and partrain's client\n"
                % __import__("torch").__version__)
        for direction, data in turns:
            f.write("%s %s\n" % (direction, data.hex()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--record")
    args = p.parse_args()
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    store.set("from_torch", "hello")
    port = store.port
    recorder = None
    if args.record:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        recorder = threading.Thread(target=proxy, args=(listener, store.port, args.record))
        recorder.start()
        port = listener.getsockname()[1]
    print(port, flush=True)
    store.wait(["bye"])
    print("from_partrain=" + store.get("from_partrain").decode(), flush=True)
    if recorder:
        recorder.join(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
