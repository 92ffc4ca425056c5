"""`specscale serve --ray`: the same OpenAI API served by R search replicas on Ray Serve (docs/scale-out.md).

Without `--address` it starts a local Ray instance on this machine; with one (`auto`, or the head's
`HOST:6379`) it joins that cluster and deploys there. While the layout comes up it says what it waits for
(`layout_start.StartReport`: at once when the layout reserves more CPUs or GPUs than the cluster has, then every
change from 10 s on). It prints `SpecScale serving <model> on R Ray Serve
replicas at http://HOST:PORT` once every replica has loaded its models, serves until Ctrl-C / SIGTERM,
drains (the ingress refuses new completions with 503 + Retry-After while the open ones finish, at most
`--drain-timeout` s), prints what the replicas still hold, then deletes the application (and, for a Ray
instance it started, shuts Serve and Ray down). A second signal skips the drain.

Ctrl-C or SIGTERM while the layout is still coming up (e.g. replicas Ray cannot schedule: 3 CPUs reserved on a
2-core machine) stops at once with `specscale serve`'s one interrupt line and status (130 / 143): nothing to
drain, and no graceful stop of Serve either, whose controller waits out the graceful-shutdown timeouts of
replicas that never started (the command hung 25 s until killed); a Ray instance this command started goes down
with everything in it (`ray.shutdown` ends its GCS, raylet and their workers), on a joined cluster the
application's deletion is requested without waiting for it (`_stop`).
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from specscale.pipeline import PipelineConfig
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.layout_start import StartReport, running_replicas
from specscale.server.settings import ServerSettings

START_POLL_S = 5.0  # how often the start-up asks Serve and Ray what the layout still waits for
STARTING_INTERRUPTED = "while the Ray layout was coming up"  # the interrupt line's tail
RAY_STARTING_INTERRUPTED = "while Ray was starting"


def add_ray_flags(p) -> None:
    defaults = ScaleOutConfig()
    group = p.add_argument_group("scale-out on Ray Serve (pip install 'specscale[ray]'; docs/scale-out.md)")
    group.add_argument("--ray", action="store_true", help="serve with R search replicas on Ray Serve")
    group.add_argument("--replicas", type=int, default=defaults.replicas, help="search replicas (with --ray)")
    group.add_argument("--address", default=None,
                       help="Ray cluster to join ('auto' or HEAD:6379; default: start a local Ray instance)")
    group.add_argument("--replica-cpus", type=float, default=defaults.replica_cpus, help="CPUs each replica reserves")
    group.add_argument("--replica-gpus", type=float, default=defaults.replica_gpus, help="GPUs each replica reserves")
    group.add_argument("--verifier-replicas", type=int, default=defaults.verifier_replicas,
                       help="PRM replicas as a deployment of their own, shared by every search replica, which then "
                            "holds the generator only (disaggregated; default 0: each replica holds its own PRM)")
    group.add_argument("--verifier-cpus", type=float, default=defaults.verifier_cpus,
                       help="CPUs each PRM replica reserves (with --verifier-replicas)")
    group.add_argument("--verifier-gpus", type=float, default=defaults.verifier_gpus,
                       help="GPUs each PRM replica reserves (with --verifier-replicas)")
    group.add_argument("--verifier-batch-wait-ms", type=float, default=defaults.verifier_batch_wait_s * 1000,
                       help="how long a PRM replica waits for the other search replicas' scoring calls to join "
                            "the first one's PRM batch (with --verifier-replicas)")


def scale_out_config(args, pipeline: PipelineConfig, settings: ServerSettings) -> ScaleOutConfig:
    """Checkpoint folders made absolute: replicas run in other working directories (and on other nodes,
    where the same paths must exist)."""
    pipeline = dataclasses.replace(pipeline, generator=str(Path(pipeline.generator).resolve()),
                                   prm=str(Path(pipeline.prm).resolve()))
    return ScaleOutConfig(pipeline, settings, replicas=args.replicas, replica_cpus=args.replica_cpus,
                          replica_gpus=args.replica_gpus, threads=args.threads,
                          verifier_replicas=args.verifier_replicas, verifier_cpus=args.verifier_cpus,
                          verifier_gpus=args.verifier_gpus, verifier_batch_wait_s=args.verifier_batch_wait_ms / 1000)


def run_ray_serve(args, config: ScaleOutConfig) -> int:
    import ray
    from ray import serve

    from specscale.interrupt import Terminated, raise_terminated
    from specscale.scaleout.application import APP_NAME, build_application

    port = args.port or free_port(args.host)
    try:
        ray.init(address=args.address, include_dashboard=False, logging_level=args.log_level.upper())
        if threading.current_thread() is threading.main_thread():  # ray.init put in a SIGTERM handler of its own
            signal.signal(signal.SIGTERM, raise_terminated)  # SIGTERM stops like Ctrl-C (cli.main: status 143)
    except SystemExit as exit_:  # that handler's sys.exit(SIGTERM): the command's SIGTERM all the same
        if exit_.code != signal.SIGTERM:
            raise
        raise Terminated(RAY_STARTING_INTERRUPTED) from None  # Ray's atexit hook stops what it started
    drained = False  # until then an interrupt stops at once (_stop)
    try:
        try:
            serve.start(http_options={"host": args.host, "port": port})
            logging_config = {"log_level": args.log_level.upper(), "enable_access_log": args.access_log}
            report = StartReport(config, _say)
            report.before_deploying(ray.cluster_resources())
            with _reporting_start(report):
                serve.run(build_application(config), name=APP_NAME, route_prefix="/",
                          logging_config=logging_config)
        except KeyboardInterrupt as interrupt:  # cli.main prints it: 'specscale serve: interrupted while ...'
            raise type(interrupt)(STARTING_INTERRUPTED) from None
        print(f"SpecScale serving {config.settings.served_model_name} on {config.replicas} Ray Serve replicas "
              f"at http://{_url_host(args.host)}:{port}{_verifier_note(config)}", flush=True)
        _wait_for_interrupt()
        drained = _drain(serve, config)
    finally:
        _stop(serve, ray, joined=args.address is not None, graceful=drained)
    print("SpecScale stopped", flush=True)
    return 0


def _say(line: str) -> None:
    print(f"SpecScale starting: {line}", flush=True)


@contextmanager
def _reporting_start(report: StartReport, poll_s: float = START_POLL_S) -> Iterator[None]:
    """While the block deploys the layout, a thread polls Serve and Ray for what it waits for (`report`)."""
    import ray
    from ray import serve

    from specscale.scaleout.application import APP_NAME

    done, started = threading.Event(), time.monotonic()

    def watch() -> None:
        while not done.wait(poll_s):
            try:
                running = running_replicas(serve.status(), APP_NAME)
                available, total = ray.available_resources(), ray.cluster_resources()
            except Exception:  # noqa: BLE001 - a report skipped, never the start
                continue
            if not done.is_set():
                report.poll(time.monotonic() - started, running, available, total)

    thread = threading.Thread(target=watch, name="specscale-layout-start", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)  # out of Ray's calls before Ray is shut down (it is a daemon: never longer)


def _wait_for_interrupt() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def _drain(serve, config: ScaleOutConfig) -> bool:
    """Let the open requests finish (new ones get 503) and print what the replicas hold afterwards; False
    when a second signal skipped it."""
    from specscale.scaleout.application import APP_NAME

    timeout_s = config.settings.drain_s
    try:
        report = serve.get_app_handle(APP_NAME).drain.remote(timeout_s).result(timeout_s=timeout_s + 30)
    except KeyboardInterrupt:  # a second signal: stop now
        print("SpecScale drain skipped", flush=True)
        return False
    state = "every search finished" if report.open_requests == 0 else "drain timeout"
    print(f"SpecScale drained ({state}): {report.describe()}", flush=True)
    return True


def _stop(serve, ray, joined: bool, graceful: bool) -> None:
    """Remove what this command deployed; a Ray instance it started goes down with Serve.

    `graceful` (after a drain): Serve deletes the application, or shuts down with the Ray instance this command
    started, stopping each replica gracefully. Otherwise (interrupted while the layout came up, a failed start,
    a skipped drain) at once: Serve's graceful stop of a replica Ray never scheduled waits out the replica's
    and the controller's timeouts (`serve.shutdown` up to 30 s), so a Ray instance this command started is
    shut down with everything in it, and on a joined cluster the deletion is only requested. Best effort
    there: a failure to clean up must not hide the interrupt (or the error) that stopped the command."""
    from specscale.scaleout.application import APP_NAME

    if graceful:
        try:
            if joined:
                serve.delete(APP_NAME)
            else:
                serve.shutdown()
        finally:  # a signal cut it short: Ray goes down all the same
            ray.shutdown()
        return
    if joined:
        with suppress(Exception):  # best effort: see above
            serve.delete(APP_NAME, _blocking=False)
    with suppress(Exception):
        ray.shutdown()


def free_port(host: str) -> int:
    """A port free now (Ray Serve's proxy binds it itself, so `--port 0` picks one here)."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _verifier_note(config: ScaleOutConfig) -> str:
    return f" (PRM on {config.verifier_replicas} replicas of its own)" if config.disaggregated else ""


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
