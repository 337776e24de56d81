"""Sample the machine's CPU use from /proc/stat every 0.1 s into a file (eleventh session):
each line is the seconds since start and the fraction of all cores per state.

    python lead11-cpu-sample.py OUT      # runs until killed
"""
import sys
import time

NAMES = "user nice system idle iowait irq softirq steal".split()


def read() -> list[int]:
    with open("/proc/stat") as stat:
        return [int(x) for x in stat.readline().split()[1:]]


def main(path: str) -> None:
    previous, started = read(), time.time()
    with open(path, "w") as out:
        while True:
            time.sleep(0.1)
            current = read()
            delta = [c - p for c, p in zip(current, previous)][:len(NAMES)]
            previous = current
            total = sum(delta) or 1
            fractions = " ".join(f"{name}={value / total:.2f}" for name, value in zip(NAMES, delta))
            out.write(f"{time.time() - started:.2f} {fractions}\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
