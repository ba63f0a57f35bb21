"""Train PPO on batch jobs: CPU jobs step the envs, a GPU job runs the learner.

Run on a Slurm or PBS Pro / OpenPBS login node (or after ``bash .ci/slurm-up.sh`` on one
machine for Slurm)::

    python examples/batch_run.py --kind slurm           # settings from examples/cluster.yaml
    python examples/batch_run.py --kind pbs --queue workq --print-scripts  # only the scripts

The CLI does the same: ``daskrl train graphs/ppo.py --cluster slurm --cluster-config
examples/cluster.yaml`` (or ``--cluster pbs --queue workq --gpus-per-job 1``). Jobs are
cancelled (``scancel``/``qdel``) when training ends, also on Ctrl-C.
"""

import argparse
from pathlib import Path

from daskrl.cluster.jobqueue import describe, job_scripts, load_spec, size_pools, start_pools
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

if __name__ == "__main__":
    here = Path(__file__).parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=here / "cluster.yaml",
                        help="job settings (default: examples/cluster.yaml)")
    parser.add_argument("--kind", choices=("slurm", "pbs"), default="slurm",
                        help="batch system (default: slurm)")
    parser.add_argument("--queue", default=None, help="Slurm partition or PBS queue (-q)")
    parser.add_argument("--walltime", default=None, help="HH:MM:SS")
    parser.add_argument("--print-scripts", action="store_true", help="show the job scripts")
    parser.add_argument("--steps", type=int, default=200_000, help="env steps (default 200000)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the run's folder (default: runs/example-KIND)")
    args = parser.parse_args()
    spec = load_spec(args.config, {"kind": args.kind, "queue": args.queue,
                                   "walltime": args.walltime})
    ppo = load_graph(str(here.parent / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=8, num_steps=128))
    distribution = get_distribution("actors-learner")
    spec = size_pools(spec, algo, distribution)
    print(describe(spec))
    if args.print_scripts:
        for pool, script in job_scripts(spec).items():
            print(f"--- {pool} job ---\n{script}")
        raise SystemExit(0)
    out = args.out or Path(f"runs/example-{args.kind}")
    cluster, client = start_pools(spec, log_directory=out / "jobs")
    try:
        print("dashboard:", client.dashboard_link, "jobs:", cluster.job_ids())
        summary = train(client, algo, distribution, RunSettings(out=out, steps=args.steps))
    finally:
        client.close()
        cluster.close()  # cancels every job
    print({k: summary[k] for k in ("env_steps", "env_steps_per_s", "eval_return_mean")})
