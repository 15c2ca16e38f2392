"""The README's tables from the runs' final.csv copies (RUN-seedS.csv): each learner's nMSE, 95%
coverage and CPU time, its ratios to ssgp's, and whether it meets issue 34's target (nMSE at most
half of ssgp's, coverage in [0.90, 0.98], within ssgp's CPU time).

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
    learners = [name for name in read(runs[0]) if name != "ssgp"]
    print(f"\n{stream}\n")
    head = ["seed", "ssgp nMSE / coverage / CPU s",
            *[f"{name}: nMSE / coverage / CPU s, nMSE and CPU / ssgp's, target" for name in learners]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios: dict[str, list[float]] = {name: [] for name in learners}
    cpus: dict[str, list[float]] = {name: [] for name in learners}
    for path in runs:
        r = read(path)
        a = r["ssgp"]
        cells = [path.stem.rsplit("seed", 1)[1], f"{a['nmse']:.4f} / {a['coverage']:.3f} / {a['cpu_s']:.1f}"]
        for name in learners:
            s = r[name]
            ratio, cpu = s["nmse"] / a["nmse"], s["cpu_s"] / a["cpu_s"]
            ratios[name].append(ratio)
            cpus[name].append(cpu)
            met = ratio <= 0.5 and cpu <= 1.0 and 0.90 <= s["coverage"] <= 0.98
            cells.append(f"{s['nmse']:.4f} / {s['coverage']:.3f} / {s['cpu_s']:.1f}, "
                         f"{ratio:.2f} and {cpu:.2f}, {'met' if met else 'not met'}")
        print("| " + " | ".join(cells) + " |")
    if len(runs) > 1:
        print()
        for name in learners:
            print(f"{name}: nMSE / ssgp median {statistics.median(ratios[name]):.2f}, worst {max(ratios[name]):.2f}; "
                  f"CPU / ssgp median {statistics.median(cpus[name]):.2f}, worst {max(cpus[name]):.2f}")
