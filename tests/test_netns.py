"""Emulated hosts (``daskrl.cluster.netns``): namespaces joined by shaped links, the
delaying relay, and a daskrl run whose workers sit on hosts of their own. Skipped, saying
why, where the machine refuses network namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daskrl.cluster.netns import EmulatedHosts, LinkShape, tbf_args, unavailable

ROOT = Path(__file__).resolve().parents[1]
REASON = unavailable()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts: {REASON}")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_shapes_refuse_nonsense_and_caps_become_tbf() -> None:
    with pytest.raises(ValueError, match="rate_mbit must be > 0"):
        LinkShape(rate_mbit=0)
    with pytest.raises(ValueError, match="rtt_ms must be >= 0"):
        LinkShape(rtt_ms=-1)
    assert tbf_args(10_000)[4] == str(1_250_000)  # a 1 ms burst at 10 Gbit/s


@needs_netns
def test_a_capped_link_carries_its_rate_and_the_namespaces_go_afterwards() -> None:
    with EmulatedHosts(2, LinkShape(rate_mbit=100)) as hosts:
        prefix = hosts.prefix
        assert prefix in _namespaces()
        rate = hosts.measure_rate(0, 1, megabytes=8)
        # tbf holds it at the cap (uncapped, veth carries gigabits here)
        assert 50 < rate < 110, rate
    assert prefix not in _namespaces()


@needs_netns
def test_the_relay_adds_the_round_trip_asked_for() -> None:
    with EmulatedHosts(2) as plain:
        base = plain.measure_rtt(0, 1)
    with EmulatedHosts(2, LinkShape(rtt_ms=10)) as hosts:
        rtt = hosts.measure_rtt(0, 1)
    assert base < 2 and 10 <= rtt < 30, (base, rtt)


INNER = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    from daskrl.cluster.hosts import WorkerSpec, host_cluster
    from daskrl.cluster.local import connect
    from daskrl.core.resources import Resources
    from daskrl.core.script import load_graph
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train
    (actors_ns, actors_ip), (learner_ns, learner_ip), me = json.loads(sys.argv[1])
    specs = [WorkerSpec("a0", 2, {"CPU": 2}, actors_ns, actors_ip),
             WorkerSpec("learner", 1, {"learner_host": 1}, learner_ns, learner_ip)]
    ppo = load_graph("graphs/ppo.py")
    algo = ppo.build(ppo.Config(num_actors=2, num_envs=2, num_steps=16))
    algo = algo.with_resources({"learner": Resources(custom={"learner_host": 1})})
    with host_cluster(specs, host=me) as cluster:
        client = connect(cluster.scheduler_address, timeout=60)
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)["workers"]
        addresses = {w["name"]: a for a, w in info.items()}
        summary = train(client, algo, get_distribution("actors-learner"),
                        RunSettings(out=Path(tempfile.mkdtemp()) / "run", steps=4 * 64,
                                    eval=False, progress=False, tensorboard=False))
        client.close()
    print(json.dumps({"addresses": addresses, "scheduler": cluster.scheduler_address,
                      "placement": summary["placement"], "iterations": summary["iterations"]}))
""")


@needs_netns
def test_a_run_places_its_fragments_on_workers_on_other_hosts() -> None:
    with EmulatedHosts(3, LinkShape(rate_mbit=1000, rtt_ms=1)) as hosts:
        where = [(hosts.namespace(i), hosts.address(i)) for i in (1, 2)] + [hosts.address(0)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run(["ip", "netns", "exec", hosts.namespace(0), sys.executable, "-c",
                               INNER, json.dumps(where)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # the scheduler on host 0, the actors' worker on host 1, the learner's on host 2
    assert out["scheduler"].startswith("tcp://10.199.0.2:")
    assert out["addresses"]["a0"].startswith("tcp://10.199.1.2:")
    assert out["addresses"]["learner"].startswith("tcp://10.199.2.2:")
    assert out["placement"]["rollout"] == ["a0", "a0"]
    assert out["placement"]["learner"] == ["learner"]
    assert out["iterations"] == 4
