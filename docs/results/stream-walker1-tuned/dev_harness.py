"""The development table of README.md: load a stream problem once, run learner option sets one after another
through gpdyn.gp.prequential.prequential (the CLI's protocol), append one JSON line per run.

    python docs/results/stream-walker1-tuned/dev_harness.py STORE PROBLEM OUT.jsonl '{"calibrate_rows": 1024, "_tag": "A"}' ...

"_learner" (default wiski), "_spc" (steps per chunk, default 1), "_seed" (the learner's seed, default 0) and "_tag" are
read off each JSON option set."""
import json, sys, time, torch
torch.set_num_threads(1)
from gpdyn.data.problems import load_problem
from gpdyn.experiments.prior_mean import split_tensors
from gpdyn.gp import make_learner
from gpdyn.gp.prequential import StreamProtocol, prequential
import gpdyn.robots.tasks  # noqa  registers problems

store, prob, out = sys.argv[1], sys.argv[2], sys.argv[3]
configs = [json.loads(c) for c in sys.argv[4:]]
problem = load_problem(store, prob, protocol="stream")
for cfg in configs:
    cfg = dict(cfg)
    name = cfg.pop("_learner", "wiski")
    spc = cfg.pop("_spc", 1)
    tag = cfg.pop("_tag", "")
    seed = cfg.pop("_seed", 0)
    learner = make_learner(name, problem.input_dim, problem.output_dim, preset="cpu", rows=len(problem.x_train) + len(problem.x_init), device="cpu",
                           dtype=torch.float64, seed=seed, **cfg)
    x, y, _ = split_tensors(problem, "train", learner.device, learner.dtype, None)
    t0 = time.process_time()
    recs = prequential(learner, x, y, StreamProtocol(steps_per_chunk=spc), progress=False)
    cpu = time.process_time() - t0
    f = recs[-1]
    row = {"store": store.split('/')[-1], "learner": name, "spc": spc, "seed": seed, "cfg": cfg, "tag": tag,
           "nmse": round(f["nmse_mean"], 5), "cov": round(f["coverage_mean"], 4), "nll": round(f["nll_mean"], 3),
           "cpu": round(cpu, 1), "init_s": round(f["init_s"], 1), "upd_ms": round(f["update_ms_per_row"], 3),
           "pred_ms": round(f["predict_ms_per_row"], 3)}
    print(json.dumps(row), flush=True)
    with open(out, "a") as fh:
        fh.write(json.dumps(row) + "\n")
