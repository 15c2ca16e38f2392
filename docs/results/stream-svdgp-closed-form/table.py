"""The README's tables from the runs' final.csv copies (RUN-seedS.csv), with the ratios to ssgp.

    python docs/results/stream-svdgp-closed-form/table.py walker50 sarcos kuka kuka-rigid-body
"""
import csv
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent


def read(path: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with path.open() as f:
        for row in csv.reader(f):
            if len(row) > 2 and row[1] in ("nmse", "coverage", "cpu_s"):
                out.setdefault(row[0], {})[row[1]] = float(row[2])
    return out


for stream in sys.argv[1:]:
    runs = sorted(HERE.glob(f"{stream}-seed*.csv"), key=lambda p: int(p.stem.rsplit("seed", 1)[1]))
    if not runs:
        sys.exit(f"no runs of {stream} in {HERE}")
    others = [name for name in read(runs[0]) if name not in ("svdgp-stream", "ssgp")]
    print(f"\n{stream}\n")
    head = ["seed", "svdgp-stream nMSE", "coverage", "CPU s", "ssgp nMSE", "coverage", "CPU s",
            *[f"{o} nMSE" for o in others], "nMSE / ssgp", "CPU / ssgp", "target met"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios, cpus = [], []
    for path in runs:
        r = read(path)
        s, a = r["svdgp-stream"], r["ssgp"]
        ratio, cpu = s["nmse"] / a["nmse"], s["cpu_s"] / a["cpu_s"]
        ratios.append(ratio)
        cpus.append(cpu)
        met = ratio <= 0.5 and cpu <= 1.0 and 0.90 <= s["coverage"] <= 0.98
        cells = [path.stem.rsplit("seed", 1)[1], f"{s['nmse']:.4f}", f"{s['coverage']:.3f}", f"{s['cpu_s']:.1f}",
                 f"{a['nmse']:.4f}", f"{a['coverage']:.3f}", f"{a['cpu_s']:.1f}",
                 *[f"{r[o]['nmse']:.4f}" for o in others], f"{ratio:.2f}", f"{cpu:.2f}", "yes" if met else "no"]
        print("| " + " | ".join(cells) + " |")
    if len(runs) > 1:
        print(f"\nnMSE / ssgp: median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}; "
              f"CPU / ssgp: median {statistics.median(cpus):.2f}, worst {max(cpus):.2f}")
