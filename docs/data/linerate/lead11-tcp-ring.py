"""Plain TCP streams round a ring on a fresh emulated cluster (eleventh session), standalone: host i
sends NBYTES to host i+1 while host i+1 reads them, all starting at one instant, REPS times on fresh
connections with no warm-up. Prints each flow's time (instant to its receiver's last byte) over the
ring bound NBYTES * 8 / rate. `geryon bench allreduce` now measures the same thing per row, warmed up
and timed like the collectives (role wire-ring).

    python lead11-tcp-ring.py HOSTS 100mbit|1gbit NBYTES REPS      # root
"""
import subprocess
import sys
import time
import uuid

from geryon.emulate.cluster import EmulatedCluster

ROLE = r'''
import socket, sys, time
mode, host, port, nbytes, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
view = memoryview(bytearray(4 << 20))
if mode == "recv":
    listener = socket.create_server(("0.0.0.0", port))
    print("ready", flush=True)
    sock, _ = listener.accept()
    got = 0
    while got < nbytes:
        n = sock.recv_into(view, min(len(view), nbytes - got), socket.MSG_WAITALL)
        if n == 0:
            break
        got += n
    print("done", time.time() - start, got, flush=True)
else:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    time.sleep(max(0, start - time.time()))
    sent = 0
    while sent < nbytes:
        sent += sock.send(view[:min(len(view), nbytes - sent)])
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
'''


def main(hosts: int, bw: str, nbytes: int, reps: int) -> None:
    rate = {"1gbit": 1e9, "100mbit": 1e8}[bw]
    bound = nbytes * 8 / rate
    python = sys.executable
    with EmulatedCluster("t" + uuid.uuid4().hex[:5], hosts=hosts, bw=bw, tcp_congestion="reno") as cluster:
        for rep in range(reps):
            start, port = time.time() + 1.0, 6000 + rep
            receivers = [cluster.popen(f"h{i + 1}", [python, "-c", ROLE, "recv", "-", str(port), str(nbytes),
                                                     str(start)], stdout=subprocess.PIPE, text=True)
                         for i in range(hosts)]
            for receiver in receivers:
                receiver.stdout.readline()
            right = [cluster.host(f"h{(i + 1) % hosts + 1}").ip for i in range(hosts)]
            senders = [cluster.popen(f"h{i + 1}", [python, "-c", ROLE, "send", right[i],
                                                   str(port), str(nbytes), str(start)]) for i in range(hosts)]
            times = [float(receiver.stdout.readline().split()[1]) for receiver in receivers]
            for process in receivers + senders:
                process.wait(timeout=60)
            flows = " ".join(f"{t / bound:.4f}" for t in times)
            print(f"{hosts} x {bw}: per flow / bound {flows}  slowest {max(times) / bound:.4f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(float(sys.argv[3])), int(sys.argv[4]))
