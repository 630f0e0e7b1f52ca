"""Floods every TCP port the driver listens on with connections that never
send a byte, while the driver runs: `per_port` connections to each port as it
appears, from 8 loopback source addresses. Prints, as JSON, the ports flooded
(connections opened on each), and the driver's CPU seconds and wall seconds
(read from /proc until it exits).

    connection_flood.py DRIVER_PID PER_PORT
"""
import json
import os
import resource
import socket
import sys
import time

pid, per_port = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
tick = os.sysconf("SC_CLK_TCK")


def listening_ports():
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cells = line.split()
                if cells[3] == "0A" and cells[9] in inodes:  # LISTEN
                    ports.add(int(cells[1].rsplit(":", 1)[1], 16))
    return ports


def cpu_seconds():
    with open(f"/proc/{pid}/stat") as f:
        cells = f.read().rsplit(")", 1)[1].split()
    return (int(cells[11]) + int(cells[12])) / tick  # utime + stime


flooded, held = {}, []
start, cpu = time.monotonic(), 0.0
while True:
    try:
        cpu = cpu_seconds()
        ports = listening_ports()
    except (OSError, IndexError):
        break  # the driver is gone
    for port in sorted(ports - flooded.keys()):
        opened = 0
        for i in range(per_port):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((f"127.0.0.{2 + i % 8}", 0))
                s.settimeout(2)
                s.connect(("127.0.0.1", port))
                held.append(s)
                opened += 1
            except OSError:
                s.close()
        flooded[port] = opened
    time.sleep(0.02)
print(json.dumps({"ports": flooded, "driver_cpu_s": round(cpu, 2),
                  "wall_s": round(time.monotonic() - start, 2)}))
