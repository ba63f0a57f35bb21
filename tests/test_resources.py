"""Resource annotations: validation, parsing, the Dask dict, fallbacks, fragment declarations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daskrl import Algorithm, Fragment, Resources, parse_resources, plan_placement
from daskrl.core.resources import parse_role_resources

pytestmark = pytest.mark.timeout(30)


def noop(*args):
    return args


# --------------------------------------------------------------------------- Resources values


@pytest.mark.parametrize("kwargs", [
    {"cpu": -1}, {"gpu": -0.5}, {"custom": {"MEM_GB": -4}},
    {"cpu": math.nan}, {"gpu": math.inf}, {"custom": {"MEM_GB": -math.inf}},
])
def test_negative_or_non_finite_values_are_rejected(kwargs):
    with pytest.raises(ValueError, match="finite number >= 0"):
        Resources(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"cpu": "1"}, {"gpu": None}, {"cpu": True}, {"custom": {"MEM_GB": "4"}},
    {"custom": {"fast_disk": False}}, {"gpu": [1]},
])
def test_non_numbers_are_rejected(kwargs):
    with pytest.raises(TypeError, match="must be a number"):
        Resources(**kwargs)


@pytest.mark.parametrize("name", ["", "1GPU", "mem-gb", "MEM GB", "a/b", "é", ".x"])
def test_bad_resource_names_are_rejected(name):
    with pytest.raises(ValueError, match="resource name .* is not valid"):
        Resources(custom={name: 1})


def test_non_string_resource_name_is_rejected():
    with pytest.raises(ValueError, match="is not valid"):
        Resources(custom={1: 1})


@pytest.mark.parametrize("key", ["CPU", "GPU", "cpu", "gpu", "Gpu"])
def test_cpu_and_gpu_in_custom_are_rejected(key):
    with pytest.raises(ValueError, match="use cpu=/gpu="):
        Resources(custom={key: 1})


@pytest.mark.parametrize("name", ["MEM_GB", "fast_disk", "a.b", "x1", "_private"])
def test_good_custom_names_are_kept(name):
    assert Resources(custom={name: 2}).to_dask() == {name: 2}


def test_custom_mapping_is_copied():
    custom = {"MEM_GB": 4}
    res = Resources(custom=custom)
    custom["MEM_GB"] = 8
    assert res.to_dask() == {"MEM_GB": 4}


def test_numpy_scalars_are_accepted():
    assert Resources(cpu=np.int64(2), gpu=np.float32(1)).to_dask() == {"CPU": 2, "GPU": 1}


def test_fallback_must_be_resources_at_declaration():
    with pytest.raises(TypeError, match="fallback"):
        Resources(gpu=1, fallback="cpu")


# --------------------------------------------------------------------------- to_dask


def test_zero_entries_are_omitted_from_the_dask_dict():
    assert Resources().to_dask() == {}
    assert Resources(cpu=0, gpu=1).to_dask() == {"GPU": 1}
    assert Resources(cpu=1, gpu=0, custom={"MEM_GB": 0, "fast_disk": 1}).to_dask() == {
        "CPU": 1, "fast_disk": 1}
    assert Resources(cpu=0.5).to_dask() == {"CPU": 0.5}


def test_zero_resources_are_satisfied_by_any_worker():
    res = Resources(cpu=0, gpu=0, custom={"MEM_GB": 0})
    assert res.satisfied_by({})
    assert res.resolve({"w0": {}}) is res


def test_satisfied_by_compares_each_key():
    res = Resources(cpu=1, gpu=1)
    assert res.satisfied_by({"CPU": 2, "GPU": 1})
    assert not res.satisfied_by({"CPU": 2})
    assert not res.satisfied_by({"CPU": 0.5, "GPU": 4})


def test_str_names_resources_and_fallback():
    assert str(Resources()) == "none"
    assert str(Resources(gpu=1, fallback=Resources(cpu=1))) == "GPU:1 (else CPU:1)"


# --------------------------------------------------------------------------- fallback resolution


GPU_CLUSTER = {"w0": {"CPU": 1}, "w1": {"CPU": 1, "GPU": 1}}
CPU_CLUSTER = {"w0": {"CPU": 1}, "w1": {"CPU": 1}}


def test_resolve_prefers_the_resources_themselves():
    res = Resources(gpu=1, fallback=Resources(cpu=1))
    assert res.resolve(GPU_CLUSTER) is res


def test_resolve_uses_the_fallback_when_nobody_offers_them():
    cpu = Resources(cpu=1)
    assert Resources(gpu=1, fallback=cpu).resolve(CPU_CLUSTER) is cpu


def test_resolve_walks_a_chain_of_fallbacks():
    last = Resources(cpu=1)
    chain = Resources(gpu=2, fallback=Resources(gpu=1, custom={"MEM_GB": 64}, fallback=last))
    assert chain.resolve({"w0": {"CPU": 1, "GPU": 1}}) is last
    assert chain.resolve({"w0": {"CPU": 1, "GPU": 1, "MEM_GB": 64}}) is chain.fallback


def test_resolve_names_every_alternative_when_nothing_fits():
    res = Resources(gpu=1, fallback=Resources(custom={"TPU": 1}))
    with pytest.raises(ValueError, match=r"no worker offers \{'GPU': 1\} or \{'TPU': 1\}"):
        res.resolve(CPU_CLUSTER)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, expected", [
    ("GPU:1", {"GPU": 1.0}),
    ("GPU:1,CPU:2", {"GPU": 1.0, "CPU": 2.0}),
    (" gpu : 1 , cpu:0.5 ", {"GPU": 1.0, "CPU": 0.5}),
    ("GPU=1", {"GPU": 1.0}),
    ("MEM_GB:16,CPU:1", {"CPU": 1.0, "MEM_GB": 16.0}),
    ("GPU:0,CPU:1", {"CPU": 1.0}),
    ("GPU:1,", {"GPU": 1.0}),
])
def test_parse_resources(text, expected):
    assert parse_resources(text).to_dask() == expected


@pytest.mark.parametrize("text, error", [
    ("", "empty resource spec"),
    (" , ", "empty resource spec"),
    ("GPU", "malformed resource 'GPU'"),
    ("GPU:", "malformed resource 'GPU:'"),
    ("GPU:one", "malformed resource 'GPU:one'"),
    ("GPU:1:2", "malformed resource 'GPU:1:2'"),
    (":1", "resource name '' is not valid"),
    ("GPU:-1", "finite number >= 0"),
    ("GPU:nan", "finite number >= 0"),
    ("GPU:inf", "finite number >= 0"),
    ("mem-gb:4", "resource name 'mem-gb' is not valid"),
])
def test_parse_resources_rejects_malformed_input(text, error):
    with pytest.raises(ValueError, match=error):
        parse_resources(text)


@pytest.mark.parametrize("text", ["GPU:1,GPU:2", "cpu:1,CPU:2"])
def test_parse_resources_rejects_repeated_keys(text):
    with pytest.raises(ValueError, match="GPU|CPU"):
        parse_resources(text)


def test_parse_role_resources():
    out = parse_role_resources(["learner=GPU:1", "rollout = CPU:2,MEM_GB:4"])
    assert {role: res.to_dask() for role, res in out.items()} == {
        "learner": {"GPU": 1.0}, "rollout": {"CPU": 2.0, "MEM_GB": 4.0}}
    assert parse_role_resources([]) == {}


@pytest.mark.parametrize("item, error", [
    ("learner", "malformed --resources 'learner': write ROLE=KEY:N"),
    ("=GPU:1", "malformed --resources '=GPU:1'"),
    (" =GPU:1", "malformed --resources"),
    ("learner=", "--resources 'learner=': empty resource spec"),
    ("learner=GPU", "--resources 'learner=GPU': malformed resource 'GPU'"),
    ("learner=GPU:x", "malformed resource 'GPU:x'"),
    ("learner=GPU:-1", "--resources 'learner=GPU:-1': .*finite number >= 0"),
    ("learner=bad key:1", "resource name 'bad key' is not valid"),
])
def test_parse_role_resources_rejects_malformed_input(item, error):
    with pytest.raises(ValueError, match=error):
        parse_role_resources([item])


# --------------------------------------------------------------------------- fragments


def test_fragment_defaults():
    frag = Fragment(noop, "rollout")
    assert frag.resources == Resources(cpu=1) and frag.replicas == 1


@pytest.mark.parametrize("role", ["", "Rollout", "roll-out", "rollout1", "_rollout", "roll out",
                                  None, 3])
def test_fragment_rejects_bad_roles(role):
    with pytest.raises(ValueError, match="role .* is not valid"):
        Fragment(noop, role)


@pytest.mark.parametrize("replicas", [0, -1, True, False, 1.0, 2.5, "2", None])
def test_fragment_rejects_bad_replicas(replicas):
    with pytest.raises(ValueError, match="'rollout': replicas must be an int >= 1"):
        Fragment(noop, "rollout", Resources(cpu=1), replicas=replicas)


@pytest.mark.parametrize("fn", [None, 3, "rollout", object()])
def test_fragment_rejects_non_callables(fn):
    with pytest.raises(TypeError, match="'learner': fn must be callable"):
        Fragment(fn, "learner")


@pytest.mark.parametrize("resources", [{"GPU": 1}, "GPU:1", None, 1])
def test_fragment_rejects_wrong_resources_type(resources):
    with pytest.raises(TypeError, match="'learner': resources must be daskrl.Resources"):
        Fragment(noop, "learner", resources)


def test_fragment_accepts_good_declarations():
    frag = Fragment(noop, "central_inference", Resources(gpu=0.5), replicas=3)
    assert (frag.role, frag.replicas, frag.resources.to_dask()) == (
        "central_inference", 3, {"GPU": 0.5})


# --------------------------------------------------------------------------- algorithm


def _algorithm(**overrides):
    fields = {"name": "t", "make_actor": noop, "make_learner": noop, "evaluate": noop,
              "num_steps": 8, "num_envs": 2, "num_actors": 2, **overrides}
    return Algorithm(**fields)


def test_algorithm_rejects_unknown_or_bad_roles():
    with pytest.raises(ValueError, match="unknown role 'critic'"):
        _algorithm(resources={"critic": Resources(cpu=1)})
    with pytest.raises(ValueError, match="role 'Learner' is not valid"):
        _algorithm(resources={"Learner": Resources(gpu=1)})
    with pytest.raises(TypeError, match=r"resources\['learner'\] must be daskrl.Resources"):
        _algorithm(resources={"learner": {"GPU": 1}})


@pytest.mark.parametrize("name", ["num_steps", "num_envs", "num_actors"])
@pytest.mark.parametrize("value", [0, -3, 2.0, "4"])
def test_algorithm_rejects_bad_counts(name, value):
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
        _algorithm(**{name: value})


def test_algorithm_rejects_bool_counts():
    with pytest.raises(ValueError, match="num_actors must be an int >= 1"):
        _algorithm(num_actors=True)


def test_with_resources_overrides_one_role_and_validates():
    algo = _algorithm(resources={"learner": Resources(gpu=1), "rollout": Resources(cpu=1)})
    moved = algo.with_resources({"learner": Resources(cpu=2)})
    assert moved.resources_for("learner").to_dask() == {"CPU": 2}
    assert moved.resources_for("rollout").to_dask() == {"CPU": 1}
    assert algo.resources_for("learner").to_dask() == {"GPU": 1}  # the original is unchanged
    assert algo.resources_for("evaluate") == Resources(cpu=1)  # unnamed roles: one CPU
    with pytest.raises(ValueError, match="unknown role 'actor'"):
        algo.with_resources({"actor": Resources(cpu=1)})


# --------------------------------------------------------------------------- placement plan


def test_plan_placement_names_the_fragment_and_the_missing_resource():
    frags = [Fragment(noop, "rollout", Resources(cpu=1), 2),
             Fragment(noop, "learner", Resources(custom={"TPU": 1}))]
    with pytest.raises(ValueError) as info:
        plan_placement(frags, GPU_CLUSTER)
    text = str(info.value)
    assert "fragment 'learner'" in text and "TPU:1" in text and "no worker offers" in text
    assert "w0: {'CPU': 1}" in text and "--resources learner=KEY:N" in text


def test_plan_placement_requires_workers():
    with pytest.raises(ValueError, match="no workers"):
        plan_placement([Fragment(noop, "rollout")], {})


def test_plan_placement_keeps_cpu_roles_off_the_gpu_worker():
    frags = [Fragment(noop, "rollout", Resources(cpu=1), 3),
             Fragment(noop, "learner", Resources(gpu=1, fallback=Resources(cpu=1)))]
    plan = plan_placement(frags, {"a": {"CPU": 1}, "b": {"CPU": 1}, "g": {"CPU": 1, "GPU": 1}})
    assert plan.workers == {"rollout": ("a", "b", "a"), "learner": ("g",)}
    assert plan.resources["learner"].to_dask() == {"GPU": 1}
    assert [plan.worker("rollout", r) for r in range(4)] == ["a", "b", "a", "a"]
    assert plan.worker("inference", 0) is None


def test_plan_placement_falls_back_and_uses_gpu_workers_when_only_they_fit():
    frags = [Fragment(noop, "rollout", Resources(cpu=1), 2),
             Fragment(noop, "learner", Resources(gpu=1, fallback=Resources(cpu=1)))]
    plan = plan_placement(frags, CPU_CLUSTER)
    assert plan.resources["learner"].to_dask() == {"CPU": 1}
    assert plan.workers == {"rollout": ("w0", "w1"), "learner": ("w0",)}
    only_gpu = plan_placement(frags, {"g": {"CPU": 1, "GPU": 1}})
    assert only_gpu.workers == {"rollout": ("g", "g"), "learner": ("g",)}


def test_parse_resources_reads_cpu_and_gpu_in_any_case():
    assert parse_resources("Cpu:1,gpu:2").to_dask() == {"CPU": 1, "GPU": 2}


# ----------------------------------------------------------- workers that declare nothing

def test_cpu_fragments_run_on_workers_that_declare_no_resources():
    frags = [Fragment(noop, "rollout", Resources(cpu=1), 2),
             Fragment(noop, "learner", Resources(cpu=2))]
    placement = plan_placement(frags, {"a": {}, "b": {}})
    assert placement.workers == {"rollout": ("a", "b"), "learner": ("a",)}
    # no CPU annotation: Dask would keep the tasks off workers that do not advertise it
    assert all(r.to_dask() == {} for r in placement.resources.values())


def test_a_gpu_fragment_on_workers_without_gpus_takes_its_fallback_or_is_refused():
    wants = Resources(gpu=1, fallback=Resources(cpu=1))
    placement = plan_placement([Fragment(noop, "learner", wants)], {"a": {}, "b": {}})
    assert placement.resources["learner"].to_dask() == {}
    with pytest.raises(ValueError, match=r"^fragment 'learner' needs GPU:1, which no worker "
                                         r"offers \(workers: a: no resources; b: no"):
        plan_placement([Fragment(noop, "learner", Resources(gpu=1))], {"a": {}, "b": {}})


def test_a_declared_gpu_or_custom_resource_is_still_asked_for():
    frags = [Fragment(noop, "rollout", Resources(cpu=1), 2),
             Fragment(noop, "learner", Resources(gpu=1, custom={"fast_disk": 1}))]
    placement = plan_placement(frags, {"a": {}, "b": {"GPU": 1, "fast_disk": 1}})
    assert placement.workers == {"rollout": ("a", "a"), "learner": ("b",)}
    assert placement.resources["learner"].to_dask() == {"GPU": 1, "fast_disk": 1}


def test_where_some_worker_declares_cpu_cpu_stays_a_resource():
    placement = plan_placement([Fragment(noop, "rollout", Resources(cpu=1), 2)],
                               {"a": {}, "b": {"CPU": 1}})
    assert placement.workers["rollout"] == ("b", "b")
    assert placement.resources["rollout"].to_dask() == {"CPU": 1}
