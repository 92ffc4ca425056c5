"""How `specscale serve --ray` stops (issue 45), on stand-ins for Ray and Ray Serve (no Ray started): Ctrl-C or
SIGTERM while the layout is still coming up — the disaggregated layout on a 2-core machine, whose replicas Ray
never schedules — ends the command at once with its one interrupt line ('specscale serve: interrupted while the
Ray layout was coming up', 130 / 143): no drain and no `serve.shutdown()`, whose controller waits out the
graceful-shutdown timeouts of replicas that never started (the command hung 25 s until killed), but
`ray.shutdown()`, which takes down the Ray instance the command started (GCS, raylet, workers); on a joined
cluster the application's deletion is requested without waiting. After a drain, Serve stops gracefully as
before, and Ray goes down even when a signal cuts that short."""

from __future__ import annotations

import signal
import sys
import types
from argparse import Namespace

import pytest

from specscale.cli import Terminated, interrupted_status, interrupted_text
from specscale.scaleout import application, command
from specscale.scaleout.config import ScaleOutConfig


class Drained:
    open_requests = 0

    def describe(self) -> str:
        return "0 requests open at the ingress"


class Stand:
    """Ray and Ray Serve as `run_ray_serve` calls them, recording the calls; `run` and `shutdown` do what the
    test says (return, or raise a signal's interrupt)."""

    def __init__(self, run=None, serve_shutdown=None):
        self.calls: list[str] = []
        self.run_effect, self.shutdown_effect = run, serve_shutdown
        ray, serve = types.ModuleType("ray"), types.ModuleType("ray.serve")
        ray.serve = serve
        ray.init = lambda **options: self.calls.append("ray.init")
        ray.cluster_resources = lambda: {"CPU": 2.0}
        ray.available_resources = lambda: {"CPU": 0.0}
        ray.shutdown = lambda: self.calls.append("ray.shutdown")
        serve.start = lambda **options: self.calls.append("serve.start")
        serve.run = self._run
        serve.shutdown = self._serve_shutdown
        serve.delete = lambda name, _blocking=True: self.calls.append(f"serve.delete(blocking={_blocking})")
        serve.status = lambda: types.SimpleNamespace(applications={})
        drain = types.SimpleNamespace(remote=lambda timeout_s: types.SimpleNamespace(
            result=lambda timeout_s: self.calls.append("drain") or Drained()))
        serve.get_app_handle = lambda name: types.SimpleNamespace(drain=drain)
        self.ray, self.serve = ray, serve

    def _run(self, app, **options) -> None:
        self.calls.append("serve.run")
        if self.run_effect is not None:
            raise self.run_effect

    def _serve_shutdown(self) -> None:
        self.calls.append("serve.shutdown")
        if self.shutdown_effect is not None:
            raise self.shutdown_effect


@pytest.fixture
def stand_in(monkeypatch):
    """Install a `Stand` as the `ray` and `ray.serve` modules; SIGTERM's handler comes back after."""
    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(application, "build_application", lambda config: "app")

    def install(stand: Stand) -> Stand:
        monkeypatch.setitem(sys.modules, "ray", stand.ray)
        monkeypatch.setitem(sys.modules, "ray.serve", stand.serve)
        return stand

    yield install
    signal.signal(signal.SIGTERM, previous)


def arguments(address: str | None = None) -> Namespace:
    return Namespace(port=8000, host="127.0.0.1", address=address, log_level="warning", access_log=False)


@pytest.mark.parametrize(("interrupt", "status"), [(KeyboardInterrupt(), 130), (Terminated(), 143)])
def test_a_signal_while_the_layout_comes_up_stops_at_once_and_takes_ray_down(stand_in, interrupt, status):
    stand = stand_in(Stand(run=interrupt))
    with pytest.raises(KeyboardInterrupt) as raised:
        command.run_ray_serve(arguments(), ScaleOutConfig(replicas=2, verifier_replicas=1))
    assert stand.calls == ["ray.init", "serve.start", "serve.run", "ray.shutdown"]  # no drain, no serve.shutdown
    assert interrupted_text(raised.value) == "interrupted while the Ray layout was coming up"
    assert interrupted_status(raised.value) == status


def test_on_a_joined_cluster_the_deletion_is_requested_without_waiting(stand_in):
    stand = stand_in(Stand(run=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        command.run_ray_serve(arguments(address="auto"), ScaleOutConfig())
    assert stand.calls == ["ray.init", "serve.start", "serve.run", "serve.delete(blocking=False)", "ray.shutdown"]


def test_sigterm_raises_the_commands_interrupt_not_rays_exit(stand_in):
    """ray.init puts in a SIGTERM handler that exits the process; the command's own comes back after it."""
    from specscale.cli import raise_terminated

    stand = stand_in(Stand(run=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        command.run_ray_serve(arguments(), ScaleOutConfig())
    assert stand.calls[0] == "ray.init" and signal.getsignal(signal.SIGTERM) is raise_terminated


def test_after_a_drain_serve_stops_gracefully(stand_in, monkeypatch, capsys):
    monkeypatch.setattr(command, "_wait_for_interrupt", lambda: None)  # the signal came
    stand = stand_in(Stand())
    assert command.run_ray_serve(arguments(), ScaleOutConfig()) == 0
    assert stand.calls == ["ray.init", "serve.start", "serve.run", "drain", "serve.shutdown", "ray.shutdown"]
    assert capsys.readouterr().out.splitlines()[-1] == "SpecScale stopped"


def test_a_signal_during_the_graceful_stop_still_takes_ray_down(stand_in, monkeypatch):
    monkeypatch.setattr(command, "_wait_for_interrupt", lambda: None)
    stand = stand_in(Stand(serve_shutdown=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        command.run_ray_serve(arguments(), ScaleOutConfig())
    assert stand.calls[-2:] == ["serve.shutdown", "ray.shutdown"]


def test_a_failing_cleanup_does_not_hide_the_interrupt(stand_in):
    stand = Stand(run=KeyboardInterrupt())
    stand.serve.delete = lambda name, _blocking=True: (_ for _ in ()).throw(RuntimeError("GCS gone"))
    stand_in(stand)
    with pytest.raises(KeyboardInterrupt):
        command.run_ray_serve(arguments(address="auto"), ScaleOutConfig())
    assert stand.calls[-1] == "ray.shutdown"


def test_sigterm_while_ray_starts_is_the_commands_sigterm():
    """ray.init's own SIGTERM handler exits with sys.exit(SIGTERM); the command says it was terminated."""
    ray, serve = types.ModuleType("ray"), types.ModuleType("ray.serve")
    ray.serve = serve

    def init(**options):
        sys.exit(signal.SIGTERM)

    ray.init = init
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "ray", ray)
            patch.setitem(sys.modules, "ray.serve", serve)
            with pytest.raises(Terminated) as raised:
                command.run_ray_serve(arguments(), ScaleOutConfig())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert interrupted_text(raised.value) == "interrupted while Ray was starting"
    assert interrupted_status(raised.value) == 143
