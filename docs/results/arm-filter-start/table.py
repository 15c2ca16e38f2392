"""The paired tables of README.md: python table.py RUNS.csv [RUNS.csv ...] (runs of scripts/arm_online_table.py
with each model plain, the filter from its prior, and NAME@stored-start, the filter from the stored samples)."""
import csv, sys, numpy as np
rows = [r for f in sys.argv[1:] for r in csv.DictReader(open(f))]
changes = list(dict.fromkeys(r['change'] for r in rows))
models = [m for m in dict.fromkeys(r['model'] for r in rows) if not m.endswith('@stored-start')]
print("| change | model | start | after: median / worst | before: median / worst | after: started − prior (better/worse) | before: started − prior (better/worse) | CPU ms mean / worst p95 |")
print("|---|---|---|---|---|---|---|---|")
for ch in changes:
    for m in models:
        for variant in (m, m + '@stored-start'):
            rs = {int(r['seed']): r for r in rows if r['change'] == ch and r['model'] == variant}
            if not rs: continue
            s = sorted(rs)
            a = np.array([float(rs[k]['after']) for k in s]) * 1e3; b = np.array([float(rs[k]['before']) for k in s]) * 1e3
            cpu = np.mean([float(rs[k]['cpu_ms']) for k in s]); p95 = max(float(rs[k]['cpu_ms_p95']) for k in s)
            pair = ['', '']
            if variant != m:
                ps = {int(r['seed']): r for r in rows if r['change'] == ch and r['model'] == m}
                common = [k for k in s if k in ps]
                for i, key in enumerate(('after', 'before')):
                    d = np.array([float(rs[k][key]) - float(ps[k][key]) for k in common]) * 1e3
                    pair[i] = f"{d.mean():+.2f} ± {d.std(ddof=1)/np.sqrt(len(d)):.2f} ({(d<0).sum()}/{(d>0).sum()})"
            print(f"| {ch} | {m} | {'stored' if variant.endswith('@stored-start') else 'prior'} | {np.median(a):.2f} / {a.max():.2f} | {np.median(b):.2f} / {b.max():.2f} | {pair[0]} | {pair[1]} | {cpu:.1f} / {p95:.1f} |")
