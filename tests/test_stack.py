"""One composition root: the real stack (the bundled toy checkpoints) and the simulated one resolve the
LV threshold and the speculative row budget through the one resolver (device_resolver.py), and the lab's
benchmark stacks are built on them, so a benchmark's options reach the same resolver."""

from specscale import device_resolver
from specscale.cli import build_parser
from specscale.composition import build_stack
from specscale.costmodel import row_budget
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import TOY
from specscale.stack import Stack
from specscale.verify import profile
from specscale_lab.bench.runs import open_testbed
from specscale_lab.bench.testbed import RealTestbed, SimulatedTestbed, Testbed


def _resolvers_recording(monkeypatch, calls: list, rows: int, threshold: int) -> None:
    """The shared resolver's two rules replaced by ones that record their arguments and answer rows / threshold."""

    def resolve_rows(override, cost_model, generator, max_rows, measured=None):
        calls.append(("rows", override))
        return rows

    def resolve_threshold(override, profiled, modelled=None):
        calls.append(("lv", override))
        return threshold

    monkeypatch.setattr(device_resolver, "resolve_row_budget", resolve_rows)
    monkeypatch.setattr(device_resolver, "resolve_lv_threshold", resolve_threshold)


def test_both_stacks_take_each_device_property_from_the_one_resolver(monkeypatch):
    assert device_resolver.resolve_row_budget is row_budget.resolve_row_budget
    assert device_resolver.resolve_lv_threshold is profile.resolve_lv_threshold
    calls: list = []
    _resolvers_recording(monkeypatch, calls, rows=5, threshold=333)
    pipeline = build_stack(PipelineConfig(generator_kv_gb=0.1, prm_kv_gb=0.1))
    simulation = build_stack(SimulationConfig(hardware="cpu", generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                              workload=TOY))
    try:
        assert isinstance(pipeline, Pipeline) and isinstance(simulation, Simulation)
        assert calls == [("rows", None), ("lv", None), ("rows", None), ("lv", None)]
        for stack in (pipeline, simulation):
            assert stack.engine.scheduler.spare_rows == stack.device.spare_rows == 5
            assert stack.device.lv_threshold_tokens == 333
            assert stack.runtime().device == stack.device
    finally:
        pipeline.close()
        simulation.close()


def test_the_lv_resolver_prefers_the_override_then_the_profile_then_the_cost_model_then_the_default():
    assert profile.resolve_lv_threshold(100, 700, 300) == 100
    assert profile.resolve_lv_threshold(None, 700, 300) == 700
    assert profile.resolve_lv_threshold(None, None, 300) == 300
    assert profile.resolve_lv_threshold(None, None) == profile.DEFAULT_LV_THRESHOLD == 2048


def test_a_prm_never_profiled_here_takes_its_knee_on_the_device_cost_model(monkeypatch, tmp_path):
    """No profile file for this PRM and device, and no profiling at start (`--no-profile-prm`): the real stack's
    threshold is the knee the simulator computes for the same PRM shape on the same device's cost model (the
    bundled CPU profile), not the A100 default."""
    from specscale.costmodel.model_profile import ModelProfile
    from specscale.costmodel.prm_knee import cost_model_knee
    from specscale.costmodel.row_budget import device_cost_model
    from specscale.pipeline import device_properties

    monkeypatch.setenv("SPECSCALE_PRM_PROFILE_DIR", str(tmp_path))  # no profile-prm file
    expected = cost_model_knee(device_cost_model("cpu"), ModelProfile.load(str(TOY_PRM)))
    assert device_properties(PipelineConfig(profile_prm=False)).lv_threshold_tokens == expected
    assert device_properties(PipelineConfig(), prm_is_local=False).lv_threshold_tokens == expected  # served elsewhere
    assert not list(tmp_path.iterdir())  # neither profiled the PRM
    simulated = Simulation(SimulationConfig(hardware="cpu", generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                            workload=TOY))
    try:
        assert simulated.device.lv_threshold_tokens == expected
    finally:
        simulated.close()
    assert device_properties(PipelineConfig(lv_threshold_tokens=640)).lv_threshold_tokens == 640


def test_a_prm_never_profiled_here_is_profiled_at_the_first_start_and_read_at_the_next(monkeypatch, tmp_path):
    """The system profiles the PRM itself (docs/design.md, "Verification"), once per model and device. The first pipeline start
    measures it (on an engine of its own, freed before the pipeline's engines), caches the profile where
    `specscale profile-prm` writes it and takes its knee; the next start reads the file and measures nothing."""
    import json

    from specscale.pipeline import device_properties

    monkeypatch.setenv("SPECSCALE_PRM_PROFILE_DIR", str(tmp_path))
    threshold = device_properties(PipelineConfig()).lv_threshold_tokens
    written = json.loads(profile.default_profile_path(TOY_PRM, "cpu").read_text())
    assert threshold == written["threshold"] == profile.knee(profile.PRMProfile.from_json(written).points)
    assert [point["batch_tokens"] for point in written["points"]] == list(profile.DEFAULT_BATCH_TOKENS)
    assert all(len(point["seconds"]) == profile.START_REPEATS for point in written["points"])

    def refuse(*args, **kwargs):
        raise AssertionError("profiled again")

    monkeypatch.setattr(profile, "profile_prm", refuse)
    assert device_properties(PipelineConfig()).lv_threshold_tokens == threshold
    assert device_properties(PipelineConfig(lv_threshold_tokens=640)).lv_threshold_tokens == 640


def test_the_row_budget_resolver_is_unbounded_without_a_cost_model():
    assert row_budget.resolve_row_budget(7, None, None, 512) == 7
    assert row_budget.resolve_row_budget(None, None, None, 512) is None


def test_the_benchmark_testbeds_are_built_on_a_stack_and_pass_their_options_to_the_one_resolver(monkeypatch):
    """`--backend real` and `--backend sim` open a testbed on a `Stack` whose device properties come from the
    resolver above, with the options `--spare-rows` / `--lv-threshold` as its overrides: no second default."""
    calls: list = []
    _resolvers_recording(monkeypatch, calls, rows=6, threshold=444)
    options = ["--out", "x", "--max-concurrency", "4", "--spare-rows", "3", "--lv-threshold", "99"]
    real = open_testbed(build_parser().parse_args(["bench", "throughput", *options, "--backend", "real", "--kv-gb", "0.1",
                                                   "--prm-kv-gb", "0.1"]))
    simulated = open_testbed(build_parser().parse_args(["simulate", "throughput", *options, "--hardware", "cpu",
                                                        "--generator", str(TOY_GENERATOR), "--prm", str(TOY_PRM)]))
    try:
        assert calls == [("rows", 3), ("lv", 99), ("rows", 3), ("lv", 99)]
        assert isinstance(real, RealTestbed) and isinstance(simulated, SimulatedTestbed)
        for bench in (real, simulated):
            assert isinstance(bench, Testbed) and isinstance(bench.stack, Stack)
            assert bench.engine is bench.stack.engine and bench.verifier is bench.stack.verifier
            assert bench.device == bench.stack.device == bench.runtime().device
            assert bench.device.lv_threshold_tokens == 444
            assert bench.device.spare_rows == bench.engine.scheduler.spare_rows == 6
            assert bench.describe()["lv_threshold_tokens"] == 444 and bench.describe()["spare_rows"] == 6
    finally:
        real.close()
        simulated.close()


def test_the_runtime_takes_the_device_properties_as_a_value_and_builds_each_flush_policy_once(monkeypatch):
    """SearchRuntime has no LV threshold of its own (its device properties are a required value), and a lazy
    request's flush policy is built once, when it is submitted, not for every queued step."""
    import inspect

    from search_backends import scripted_request, scripted_runtime
    from specscale.runtime import prm_batches
    from specscale.runtime.runtime import SearchRuntime
    from specscale.search.presets import preset_config

    assert inspect.signature(SearchRuntime).parameters["device"].default is inspect.Parameter.empty
    built: list[int] = []
    real_flush_policy = prm_batches.flush_policy

    def counting(config, threshold_tokens):
        built.append(threshold_tokens)
        return real_flush_policy(config, threshold_tokens)

    monkeypatch.setattr(prm_batches, "flush_policy", counting)
    runtime = scripted_runtime(max_concurrency=3)
    requests = [scripted_request(i, preset_config("specscale", beam_size=4, beam_width=2, max_rounds=4, seed=i))
                for i in range(3)]
    runtime.run(requests)
    assert built == [runtime.device.lv_threshold_tokens] * 3
    assert runtime.metrics.summary()["verifier_calls"] > 0
